"""systemd-logind facts → how the restore agent is detached (pure): :mod:`eagle3ops.commands.logind`. The same facts
read from a real logind: ``tests/test_systemd_real.py``."""

from __future__ import annotations

import pytest

from eagle3ops.commands import logind as lg


def _facts(kill: str, exclude: str, only: str, linger: str = "no", user: str = "e3ops", run: bool = True) -> str:
    return (f"user={user}\nprop=b {kill}\nprop={exclude}\nprop={only}\nlinger={linger}\n"
            + ("systemd_run=yes\n" if run else ""))


@pytest.mark.parametrize("text, applies", [
    (_facts("true", 'as 1 "root"', "as 0"), True),                       # logind.conf(5)'s default exclusion: root
    (_facts("true", 'as 1 "root"', "as 0", user="root"), False),
    (_facts("false", 'as 1 "root"', "as 0"), False),
    (_facts("true", 'as 2 "root" "e3ops"', "as 0"), False),
    (_facts("true", "as 0", 'as 1 "alice"'), False),                      # KillOnlyUsers names someone else
    (_facts("true", "as 0", 'as 2 "alice" "e3ops"'), True),
    ("user=e3ops\nlogind=absent\n", False),                               # no systemd tools
    ("user=e3ops\nlinger=\n", False),                                     # busctl answered nothing
])
def test_whether_logind_ends_the_users_session_processes(text, applies):
    assert lg.parse(text).applies is applies


def test_detach_mode_user_service_only_where_needed_and_possible():
    assert lg.detach_mode(lg.parse(_facts("false", "as 0", "as 0"))) == ("setsid", None)
    assert lg.detach_mode(lg.parse(_facts("true", "as 0", "as 0", linger="yes"))) == ("user-service", None)
    mode, why = lg.detach_mode(lg.parse(_facts("true", "as 0", "as 0", linger="no")))
    assert mode == "setsid" and "loginctl enable-linger e3ops" in why and "KillExcludeUsers=e3ops" in why
    mode, why = lg.detach_mode(lg.parse(_facts("true", "as 0", "as 0", linger="yes", run=False)))
    assert "has no systemd-run" in why


def test_root_stays_exempt_while_kill_exclude_users_is_empty():
    """logind's ``manager_shall_kill`` (systemd ``src/login/logind-core.c``) returns false for root while
    ``KillExcludeUsers=`` is empty (``KillExcludeUsers=`` assigned nothing): busctl then answers ``as 0``. Measured on
    systemd 252 (Debian bookworm, the real-systemd test host): with ``KillUserProcesses=yes`` and that empty list,
    root's SSH session scope was left ``active (abandoned)`` at logout and its ``setsid nohup`` supervisor ran on;
    with ``KillExcludeUsers=nobody`` the same scope was stopped with it."""
    sk = lg.parse(_facts("true", "as 0", "as 0", user="root"))
    assert sk.applies is False
    assert lg.detach_mode(sk) == ("setsid", None)
    assert lg.parse(_facts("true", "as 0", "as 0", user="e3ops")).applies is True  # only root is kept by it
    assert lg.parse(_facts("true", 'as 1 "nobody"', "as 0", user="root")).applies is True
