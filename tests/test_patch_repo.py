"""The checked-in series: ``eagle3ops patch check`` passes for every profile of patches/profiles.yaml against the
real pinned wheels (what CI runs), and every patch names a probe of the real registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3ops.patches.series import load_profiles

from test_patch_helpers import run_cli

PATCHES = Path(__file__).resolve().parents[1] / "patches"
PROFILES = sorted(load_profiles(PATCHES).profiles)


@pytest.mark.parametrize("profile", PROFILES)
def test_check_passes_for_profile(profile: str) -> None:
    r = run_cli("check", "--patches-dir", PATCHES, "--profile", profile)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "warning" not in r.stdout  # probe names were checked, not skipped
    assert ": OK (" in r.stdout


def test_list_shows_every_profile() -> None:
    r = run_cli("list", "--patches-dir", PATCHES)
    assert r.returncode == 0, r.stdout + r.stderr
    for p in PROFILES:
        assert f"profile {p}" in r.stdout
    assert "profile speculators-0.3.0-vllm-0.16.0 (default)" in r.stdout
