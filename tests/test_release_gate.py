"""``eagle3ops release --gate`` (issue 31): a serving change measured against the live release through the speculation
gate's own measure and decide functions, kept only when not slower beyond the margin.

Fast tests: the measurements are monkeypatched (as tests/test_gate_holes.py and tests/test_speculate_ship.py do),
the windows stubbed at the module boundary (``eagle3ops.window.run.run_window``), the decision is the real
:func:`eagle3ops.gate.decide.decide` (seeded bootstrap) on per-pass, per-prompt figures with noise. On the
sandbox the same path needs a live release (the lead runs the `Done when` check: a faster flag change kept, a
slower one rolled back)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import eagle3ops.window.run as window_run
from eagle3ops.config import load_inventory
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.speculate import gated, ship
from eagle3ops.gate.metrics import SpecDelta
from eagle3ops.gate.replay import LevelResult

REPO = Path(__file__).resolve().parents[1]
#: Per-pass noise of the stand-in measurements (+-2 %), the same for both sides.
NOISE = (1.0, 1.02, 0.98, 1.01, 0.99)


def _passes(c: int, tok_s: float) -> list[LevelResult]:
    """Five passes of 4 prompts x 16 tokens at ``tok_s`` output tokens/s (per-pass noise :data:`NOISE`, per-prompt
    spread), as :func:`eagle3ops.speculate.ship.measure_on_host` returns them."""
    out = []
    for n in NOISE:
        rate = tok_s * n
        secs = tuple(16 / rate * c * f for f in (0.95, 1.05, 1.0, 1.0))
        wall = 64 / rate
        out.append(LevelResult(c, 4, 0, 64, wall, round(64 / wall, 3), 20.0, 25.0, 100.0, 0, (16,) * 4, secs,
                               (100.0,) * 4))
    return out


class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok = stdout, "", ok


class _Remote:
    """Answers ``releases/current`` (3, then what the last stubbed window made live) and nothing else; records every
    command and what was written."""

    def __init__(self):
        self.host = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
        self.dry_run, self.current, self.calls = False, 3, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.calls.append((list(argv), stdin))
        if any(str(a).endswith("releases/current") for a in argv):
            return _Res(f"{self.current}\n")
        return _Res("", ok="inspect" not in argv)


@pytest.fixture()
def gate(monkeypatch):
    """Run ``gated_release`` with the change measuring ``factor`` x the live release's tokens/s; returns (result,
    windows run, remote)."""
    def run(factor: float, **kw):
        r = _Remote()
        measured = iter([1.0, factor])
        windows = []

        def measure(r_, image, prompts, levels, max_tokens, passes, api_key=None, **_):
            f = next(measured)
            assert passes == r_.host.serving.gate_passes and len(prompts) == r_.host.serving.gate_prompts
            return ({c: _passes(c, 50.0 * f / c ** 0.2) for c in levels}, {c: SpecDelta(0, 0, 0, {}) for c in levels})

        def stub_window(r_, **w):
            windows.append(w)
            if w["kind"] == "release":
                r_.current = 4
                return {"outcome": "ok", "window_id": "w-release", "release": 4, "release_before": 3}
            r_.current = w["to_release"]
            return {"outcome": "ok", "window_id": "w-rollback", "release": w["to_release"]}

        monkeypatch.setattr(ship, "measure_on_host", measure)
        monkeypatch.setattr(window_run, "run_window", stub_window)
        res = gated.gated_release(r, ReleaseChange(args=["--max-num-seqs", "64"]), pipeline_image="p:1",
                                  pipeline_image_id="sha256:1", echo=lambda *_: None, **kw)
        return res, windows, r

    return run


def test_a_faster_change_is_kept(gate):
    res, windows, r = gate(1.2)
    assert res["verdict"] == "keep", res["reason"]
    assert [w["kind"] for w in windows] == ["release"] and windows[0]["change"].args == ["--max-num-seqs", "64"]
    assert res["rule"] == "not_slower" and res["acceptance_floor"] is None and res["live_release"] == 4
    assert res["interval"]["low"] >= 1 - res["margin"]
    written = {argv[-1]: stdin for argv, stdin in r.calls if argv[0] == "tee"}
    stored = json.loads(written[f"{r.host.state_dir}/gates/w-release.json"])
    assert stored["verdict"] == "keep" and stored["change"]["args"] == ["--max-num-seqs", "64"]
    audit = json.loads(next(stdin for argv, stdin in r.calls if argv[:2] == ["tee", "-a"]))
    assert audit["kind"] == "release-gate" and audit["figures"]["throughput_ratio"] == pytest.approx(1.2, abs=0.01)


def test_an_equal_change_is_kept_not_slower_is_enough(gate):
    # speculate's rule (faster by the margin) would roll this back; release --gate keeps what is not slower
    res, windows, _ = gate(1.0)
    assert res["verdict"] == "keep", res["reason"]
    assert [w["kind"] for w in windows] == ["release"]


def test_a_slower_change_is_rolled_back_to_the_live_release_before(gate):
    res, windows, _ = gate(0.8)
    assert res["verdict"] == "rollback", res["reason"]
    assert [w["kind"] for w in windows] == ["release", "rollback"] and windows[1]["to_release"] == 3
    assert res["live_release"] == 3 and res["rollback_window"]["outcome"] == "ok"
    assert "upper bound below x0.950" in res["reason"]


def test_a_negative_margin_is_refused_before_anything_runs(gate):
    with pytest.raises(ship.SpeculateError, match="is negative"):
        gate(1.2, margin=-0.1)
