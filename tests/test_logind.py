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
