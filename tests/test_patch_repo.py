"""The checked-in series: ``eagle3ops patch check`` passes for every profile of patches/profiles.yaml against the
real pinned wheels (what CI runs), and every patch names a probe of the real registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops.patches.series import load_profiles

from test_patch_helpers import run_cli

PATCHES = Path(__file__).resolve().parents[1] / "patches"
PROFILES = sorted(load_profiles(PATCHES).profiles)


def _check_runs() -> list[tuple[str, ...]]:
    """The profiles, each in one ``patch check`` run: a profile whose series dirs are all in another profile's, with
    the same pins (the series' only profile-dependent check is its patches' requires against the profile's pins),
    is checked in that profile's run, after it; the CLI checks a series dir once per run ("checked above"). Checking
    vllm/0.16.0 again on its two wheels for vllm-0.16.0-serving cost ~15 s of the suite."""
    profs = load_profiles(PATCHES).profiles

    def covers(big: str, small: str) -> bool:
        b, s = profs[big], profs[small]
        return (big != small and set(s.series_dirs) <= set(b.series_dirs) and set(s.requires) == set(b.requires)
                and (set(s.series_dirs) < set(b.series_dirs) or big < small))

    covered = {s: next(b for b in PROFILES if covers(b, s)) for s in PROFILES if any(covers(b, s) for b in PROFILES)}
    return [(p, *[s for s in PROFILES if covered.get(s) == p]) for p in PROFILES if p not in covered]


@pytest.mark.parametrize("profiles", _check_runs(), ids="+".join)
def test_check_passes_for_profile(profiles: tuple[str, ...]) -> None:
    r = run_cli("check", "--patches-dir", PATCHES, *[w for p in profiles for w in ("--profile", p)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "warning" not in r.stdout  # probe names were checked, not skipped
    assert ": OK (" in r.stdout
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("profile ")] == [f"profile {p}" for p in profiles]


def test_every_profile_is_checked_once() -> None:
    """The runs above cover every profile, each once, and group vllm-0.16.0-serving into the CPU stand-in's run (its
    one series dir is the stand-in's first, its pins the same)."""
    runs = _check_runs()
    assert sorted(p for run in runs for p in run) == PROFILES
    assert ("vllm-0.16.0-serving-cpu-standin", "vllm-0.16.0-serving") in runs


def test_list_shows_every_profile() -> None:
    r = run_cli("list", "--patches-dir", PATCHES)
    assert r.returncode == 0, r.stdout + r.stderr
    for p in PROFILES:
        assert f"profile {p}" in r.stdout
    assert "profile speculators-0.3.0-vllm-0.16.0 (default)" in r.stdout
