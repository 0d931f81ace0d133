"""An outside head (``speculate --head``) is estimated before any restart, on hidden states the
host already has from the run (its held-out samples), and refused below ``serving.acceptance_floor`` unless
``--force``; a head that cannot be estimated there is refused unless forced, naming why and the fix; the results
of a head from elsewhere are kept in its own folder, never written over the run's own ``speculate/result.json``.

The driver with fakes (no sandbox): the host's inspect helper answers as :mod:`eagle3ops.speculate.onhost` does;
the estimate itself (torch, speculators, the run's hidden states) is tested in the pipeline image
(``tests/image/test_stages.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.config import load_inventory
from eagle3ops.speculate import onhost
from test_speculate_ship import HEAD, _FakeRemote, _Res

REPO = Path(__file__).resolve().parents[1]


def _head(tmp_path: Path) -> Path:
    d = tmp_path / "outside-head"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HEAD))
    (d / "model.safetensors").write_bytes(b"\0" * 16)
    return d


def _remote(estimate: dict | None) -> tuple[_FakeRemote, list[dict]]:
    """The fake host; its inspect answer carries ``estimate`` (as the helper answers for an outside head), and the
    requests sent to the inspect helper are recorded."""
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    r = _FakeRemote(h, [7])
    orig, requests = r.run, []

    def run(argv, **kw):
        res = orig(argv, **kw)
        if argv[-1] == "inspect":
            requests.append(json.loads(kw.get("stdin") or "{}"))
            ans = onhost.parse_answer(res.stdout)
            ans["estimate"] = estimate
            res = _Res(onhost.MARK + json.dumps(ans))
        return res

    r.run = run
    return r, requests


def _window(monkeypatch) -> list[dict]:
    from eagle3ops.window import run as window_run

    windows: list[dict] = []

    def fake_window(r_, *, kind, **kw):
        windows.append({"kind": kind, **kw})
        job = kw["speculate"]
        return {"window_id": "w-spec", "outcome": "ok", "restarts_s": [30.0],
                "speculate": {"verdict": "rollback", "reason": "why", "attempt_dir": f"{job.results_dir}/w-spec",
                              "live_release": 7, "rollback": None}}

    monkeypatch.setattr(window_run, "run_window", fake_window)
    return windows


ESTIMATE = {"acceptance_length": 2.1, "per_position": {"0": 0.6, "1": 0.35, "2": 0.15}, "held_out_samples": 5,
            "held_out_tokens": 900, "kind": "teacher-forced", "source": "run r1's held-out hidden states"}


def test_the_driver_asks_the_host_to_estimate_an_outside_head_and_records_it(tmp_path, monkeypatch):
    from eagle3ops.speculate import ship

    r, requests = _remote(ESTIMATE)
    windows = _window(monkeypatch)
    ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", head=_head(tmp_path)), echo=lambda *_: None)
    assert requests and requests[0]["estimate"]["max_tokens"] > 0, requests
    job = windows[0]["speculate"]
    assert job.figures["offline_estimate"] == 2.1
    assert job.figures["offline_estimate_record"]["source"] == ESTIMATE["source"]


def test_an_outside_head_that_accepts_nothing_is_refused_before_any_restart(tmp_path, monkeypatch):
    from eagle3ops.speculate import ship

    r, _ = _remote({**ESTIMATE, "acceptance_length": 1.02, "per_position": {"0": 0.02, "1": 0.0, "2": 0.0}})
    windows = _window(monkeypatch)
    head = _head(tmp_path)
    with pytest.raises(ship.SpeculateError) as e:
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", head=head), echo=lambda *_: None)
    msg = str(e.value)
    assert "1.020" in msg and "floor" in msg and "--force" in msg and str(head) in msg, msg
    assert not windows, "a window ran: serving was restarted for a head estimated below the floor"
    forced = ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", head=head, force=True),
                            echo=lambda *_: None)
    assert windows and forced["verdict"] == "rollback" and windows[0]["speculate"].figures["force"] is True


def test_an_outside_head_that_cannot_be_estimated_is_refused_unless_forced(tmp_path, monkeypatch):
    from eagle3ops.speculate import ship

    why = "run r1 has no hidden states on this host (no extract/manifest.json)"
    r, _ = _remote({"unavailable": why})
    windows = _window(monkeypatch)
    head = _head(tmp_path)
    with pytest.raises(ship.SpeculateError) as e:
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", head=head), echo=lambda *_: None)
    msg = str(e.value)
    assert why in msg and "--force" in msg and "eagle3ops extract" in msg, msg
    assert not windows
    ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", head=head, force=True),
                   echo=lambda *_: None)
    job = windows[0]["speculate"]
    assert job.figures["offline_estimate"] is None and any(why in w for w in job.figures["warnings"])


def test_an_outside_heads_results_are_kept_apart_from_the_runs_own(tmp_path, monkeypatch):
    from eagle3ops.speculate import ship

    r, _ = _remote(ESTIMATE)
    windows = _window(monkeypatch)
    ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", head=_head(tmp_path)), echo=lambda *_: None)
    ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p"), echo=lambda *_: None)
    outside, own = windows[0]["speculate"], windows[1]["speculate"]
    run_latest = f"{r.host.data_dir}/runs/r1/speculate/result.json"
    assert own.latest == run_latest
    assert outside.latest == f"{outside.results_dir}/result.json" != run_latest
    assert outside.results_dir != own.results_dir
