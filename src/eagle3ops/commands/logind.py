"""systemd-logind facts as argv lists and pure parsers: does logind end the SSH session's processes when it closes?

With ``KillUserProcesses=yes`` (logind.conf(5); the default of some distributions' builds), logind stops the session's
scope unit when the SSH session closes, and with it every process started from that session, ``setsid nohup``
children included: the restore agent that process and systemd serving rely on would die with the driver's SSH
connection, leaving serving stopped. logind.conf(5) exempts the users of ``KillExcludeUsers=`` (default ``root``) and,
when ``KillOnlyUsers=`` is set, applies only to those; while ``KillExcludeUsers=`` is empty (assigned nothing: busctl
answers ``as 0``) root stays exempt all the same (systemd's ``manager_shall_kill``, ``src/login/logind-core.c``;
measured on systemd 252: root's session scope was abandoned at logout, its processes kept). A user service (``systemd-run --user``) lives in the user's
manager, not the session's scope, and outlives the session while the user lingers (``loginctl enable-linger``;
without linger the manager itself stops a few seconds after the last session: ``UserStopDelaySec=``). Measured on a
real systemd 252 with sshd + pam_systemd (a container with CAP_SYS_ADMIN, 2026-12-07): a ``setsid nohup`` child of
an SSH session was gone 4 s after the session closed; a ``systemd-run --user`` unit started from the same session
ran on with linger and was gone without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eagle3ops.commands.types import Read

_FACTS_SH = r"""
u=$(id -un)
echo "user=$u"
command -v busctl >/dev/null 2>&1 || { echo "logind=absent"; exit 0; }
busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager \
  KillUserProcesses KillExcludeUsers KillOnlyUsers 2>/dev/null | sed 's/^/prop=/' || echo "logind=absent"
echo "linger=$(loginctl show-user "$u" -p Linger --value 2>/dev/null)"
command -v systemd-run >/dev/null 2>&1 && echo "systemd_run=yes"
"""


def facts() -> Read:
    """The SSH user's name, logind's ``KillUserProcesses``, ``KillExcludeUsers`` and ``KillOnlyUsers`` (``busctl
    get-property``), the user's ``Linger`` and whether ``systemd-run`` exists, as ``key=value`` lines
    (:func:`parse`). Read-only; prints ``logind=absent`` on a host without systemd's tools."""
    return Read(["sh", "-c", _FACTS_SH, "eagle3ops-logind"])


@dataclass(frozen=True)
class SessionKill:
    """What :func:`facts` printed, parsed (:func:`parse`).

    Attributes:
        user: the SSH user.
        known: logind answered (False: no logind, or not readable: nothing is assumed).
        kill_user_processes, exclude, only: logind's settings.
        linger: the user lingers (its user manager runs without a session).
        systemd_run: ``systemd-run`` is on the PATH.
    """

    user: str
    known: bool
    kill_user_processes: bool = False
    exclude: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    linger: bool = False
    systemd_run: bool = False

    @property
    def applies(self) -> bool:
        """logind ends this user's session processes at logout (logind.conf(5): ``KillUserProcesses=yes``, the user
        not in ``KillExcludeUsers=`` nor root while that list is empty, and in ``KillOnlyUsers=`` when that is set)."""
        if not (self.known and self.kill_user_processes) or self.user in self.exclude:
            return False
        if self.user == "root" and not self.exclude:  # logind keeps root while the list is empty (module doc)
            return False
        return not self.only or self.user in self.only


def _strv(value: str) -> tuple[str, ...]:
    """busctl's ``as N "a" "b"`` → ``("a", "b")``."""
    return tuple(re.findall(r'"((?:[^"\\]|\\.)*)"', value))


def parse(text: str) -> SessionKill:
    """:func:`facts`'s output → :class:`SessionKill` (pure). The three ``prop=`` lines come in the order asked:
    ``b true|false``, then two ``as N "..."`` lists."""
    kv: dict[str, str] = {}
    props: list[str] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "prop":
            props.append(value.strip())
        else:
            kv.setdefault(key, value.strip())
    known = kv.get("logind") != "absent" and len(props) == 3 and props[0].startswith("b ")
    if not known:
        return SessionKill(user=kv.get("user", ""), known=False, systemd_run=kv.get("systemd_run") == "yes")
    return SessionKill(user=kv.get("user", ""), known=True, kill_user_processes=props[0] == "b true",
                       exclude=_strv(props[1]), only=_strv(props[2]), linger=kv.get("linger") == "yes",
                       systemd_run=kv.get("systemd_run") == "yes")


#: How the restore agent is detached from the SSH session: ``setsid`` (``setsid nohup``), or ``user-service``
#: (``systemd-run --user``: outlives a session that logind kills, while the user lingers).
DETACH_MODES = ("setsid", "user-service")


def detach_mode(sk: SessionKill, who: str = "the restore agent",
                harm: str = "leave serving stopped") -> tuple[str, str | None]:
    """``(mode, refusal)`` for the processes a window leaves running on a host with these facts (pure): ``setsid``
    where logind leaves the session's processes alone; ``user-service`` where it kills them and the user lingers with
    ``systemd-run`` available; otherwise a refusal naming the cause and the fixes (``who`` would die with the SSH
    session, and ``harm`` follow)."""
    if not sk.applies:
        return "setsid", None
    if sk.linger and sk.systemd_run:
        return "user-service", None
    why = "does not linger" if not sk.linger else "has no systemd-run"
    return "setsid", (f"logind ends the processes of {sk.user}'s SSH sessions when they close (KillUserProcesses=yes "
                      f"applies to {sk.user}) and {sk.user} {why}: {who} would die with the driver's SSH "
                      f"session and {harm}. Fix: `loginctl enable-linger {sk.user}` (eagle3ops then runs them as "
                      f"user services, `systemd-run --user`), or exempt the user in /etc/systemd/logind.conf "
                      f"(KillExcludeUsers={sk.user}, or KillUserProcesses=no) and restart systemd-logind")
