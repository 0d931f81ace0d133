"""The build is planned before it runs (`deploy --dry-run` once built the image): :func:`plan_build`
decides base, profile, content tag and build args without building, and :func:`build_image` builds exactly that
plan. Uses the local build engine read-only (the local base must be there, as for every image test)."""

from __future__ import annotations

import pytest

from eagle3ops import images
from eagle3ops.images import build as build_mod


class WouldBuild(Exception):
    """A builder was called."""


@pytest.fixture
def no_builder(monkeypatch):
    def refuse(*a, **k):
        raise WouldBuild("a builder was called")

    monkeypatch.setattr(build_mod, "buildkit_build", refuse)
    monkeypatch.setattr(build_mod, "_sdk_build", refuse)


def test_plan_names_base_profile_tag_and_build_args_without_building(no_builder):
    base = images.LOCAL_BASE_TAG
    bp = images.plan_build("pipeline", base_image=base)
    assert bp.tag == images.content_tag("pipeline", None, base)
    assert bp.base == base and bp.base_id.startswith("sha256:")
    assert bp.build_args["BASE_IMAGE"] == base and bp.build_args["PROFILE"] == bp.profile
    assert bp.labels["io.eagle3ops.verified"].startswith("build:")
    text = "\n".join(bp.lines())
    assert bp.tag in text and f"--build-arg BASE_IMAGE={base}" in text and bp.profile in text
    # build_image builds that plan: the builder gets the plan's tag and build args
    with pytest.raises(WouldBuild):
        images.build_image(plan=bp)


def test_build_image_passes_the_plans_values_to_the_builder(monkeypatch):
    got = {}

    def fake_build(ctx, tag, **kw):
        got.update(tag=tag, **kw)
        raise WouldBuild

    monkeypatch.setattr(build_mod, "buildkit_build", fake_build)
    bp = images.plan_build("pipeline", base_image=images.LOCAL_BASE_TAG)
    with pytest.raises(WouldBuild):
        images.build_image(plan=bp)
    assert got["tag"] == bp.tag and got["build_args"] == bp.build_args and got["labels"] == bp.labels
