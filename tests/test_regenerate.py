"""`eagle3ops regenerate`: the target answers the training prompts through live serving, resumably.

Unit tests drive :func:`eagle3ops.speculate.regenerate.regenerate` against a stand-in server (``httpx.MockTransport``
answering like vLLM's chat endpoint); the sandbox test asks the sandbox's real vLLM.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from eagle3ops.speculate import reach
from eagle3ops.speculate import regenerate as rg
from eagle3ops.speculate.prompts import Prompt
from eagle3ops.speculate.regensource import humaneval_train

PROMPTS = [Prompt(f"P/{i}", f"def f{i}(x):\n    \"\"\"return x + {i}\"\"\"\n") for i in range(5)]


class StandInServer:
    """A stand-in OpenAI chat server: answers ``"<model> says <n user turns>: <last user text[:12]>"``; ``fail``
    maps a prompt marker to the HTTP status it answers with (always)."""

    def __init__(self, fail: dict[str, int] | None = None):
        self.fail = fail or {}
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.16.0-stand-in"})
        body = json.loads(request.content)
        with self.lock:
            self.bodies.append(body)
        last = body["messages"][-1]["content"]
        for marker, status in self.fail.items():
            if marker in last:
                return httpx.Response(status, json={"error": "stand-in failure"})
        users = sum(m["role"] == "user" for m in body["messages"])
        text = f"{body['model']} says {users}: {last[:12]}"
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": text},
                                                      "finish_reason": "stop"}],
                                         "usage": {"completion_tokens": 7}})


def _run(tmp_path: Path, server: StandInServer, **settings) -> dict:
    s = rg.GenSettings(**{"model": "m", "max_tokens": 16, "concurrency": 2, **settings})
    p = rg.plan(rg.items_from_prompts(PROMPTS), s, tmp_path)
    return rg.regenerate(p, "http://serving.invalid", progress=False, transport=httpx.MockTransport(server))


def _log(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / rg.ANSWERS).read_text().splitlines()]


def test_answers_become_the_assistant_turns_and_the_manifest_records_the_settings(tmp_path):
    server = StandInServer()
    man = _run(tmp_path, server, seed=7)
    rows = [json.loads(x) for x in (tmp_path / rg.DATASET).read_text().splitlines()]
    assert [r["id"] for r in rows] == [p.id for p in PROMPTS]  # the items' order, whatever finished first
    assert rows[0]["messages"] == [{"role": "user", "content": PROMPTS[0].text},
                                   {"role": "assistant", "content": f"m says 1: {PROMPTS[0].text[:12]}"}]
    assert all(b["seed"] == 7 and b["temperature"] == 0.0 and b["max_tokens"] == 16 for b in server.bodies)
    assert man["settings"]["seed"] == 7 and man["settings"]["concurrency"] == 2 and man["settings"]["model"] == "m"
    assert man["vllm_version"] == "0.16.0-stand-in"
    assert man["prompt_set_sha256"] == rg.prompt_set_sha256(rg.items_from_prompts(PROMPTS))
    assert (man["answered"], man["answered_now"], man["failed"], man["completion_tokens"]) == (5, 5, 0, 35)
    assert json.loads((tmp_path / rg.MANIFEST).read_text()) == man


def test_a_rerun_skips_prompts_already_answered_with_the_same_settings(tmp_path):
    _run(tmp_path, StandInServer())
    dataset = (tmp_path / rg.DATASET).read_text()
    again = StandInServer()
    man = _run(tmp_path, again)
    assert again.bodies == []  # nothing sent
    assert (man["skipped_already_answered"], man["answered_now"], man["answered"]) == (5, 0, 5)
    assert (tmp_path / rg.DATASET).read_text() == dataset
    assert len(_log(tmp_path)) == 5


def test_a_torn_last_line_of_the_resume_log_is_sent_again(tmp_path):
    _run(tmp_path, StandInServer())
    lines = (tmp_path / rg.ANSWERS).read_text().splitlines()
    (tmp_path / rg.ANSWERS).write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # the driver died mid-write
    again = StandInServer()
    _run(tmp_path, again)
    assert len(again.bodies) == 1


@pytest.mark.parametrize("change", [{"max_tokens": 32}, {"temperature": 0.7}, {"seed": 1}, {"model": "other"}])
def test_a_changed_setting_answers_everything_again(tmp_path, change):
    _run(tmp_path, StandInServer())
    again = StandInServer()
    man = _run(tmp_path, again, **change)
    assert len(again.bodies) == 5 and man["skipped_already_answered"] == 0 and man["answered_now"] == 5


def test_concurrency_changes_nothing_about_the_answers(tmp_path):
    _run(tmp_path, StandInServer(), concurrency=1)
    again = StandInServer()
    _run(tmp_path, again, concurrency=4)
    assert again.bodies == []


def test_a_failing_request_is_retried_a_bounded_number_of_times_then_recorded_and_retried_by_a_rerun(
        tmp_path, monkeypatch):
    monkeypatch.setattr(rg, "wait_exponential", lambda **_: (lambda _state: 0))  # no back-off sleeps in the test
    server = StandInServer(fail={"x + 3": 503})
    man = _run(tmp_path, server, attempts=3)
    sent_3 = [b for b in server.bodies if "x + 3" in b["messages"][-1]["content"]]
    assert len(sent_3) == 3  # transient (503): retried, 3 attempts in all
    assert (man["answered"], man["failed"]) == (4, 1) and man["errors"][0].startswith("P/3: HTTPStatusError")
    failed = [r for r in _log(tmp_path) if r.get("error")]
    assert [(r["id"], r["attempts"]) for r in failed] == [("P/3", 3)] and "messages" not in failed[0]
    assert "P/3" not in (tmp_path / rg.DATASET).read_text()

    again = StandInServer()
    man = _run(tmp_path, again)
    assert [b["messages"][-1]["content"] for b in again.bodies] == [PROMPTS[3].text]  # only the failed one
    assert (man["answered"], man["failed"], man["skipped_already_answered"]) == (5, 0, 4)


def test_a_refused_request_is_not_retried(tmp_path):
    server = StandInServer(fail={"x + 1": 400})  # e.g. the prompt is longer than the server's max_model_len
    man = _run(tmp_path, server, attempts=3)
    assert len([b for b in server.bodies if "x + 1" in b["messages"][-1]["content"]]) == 1
    assert man["failed"] == 1 and "stand-in failure" in man["errors"][0]


def test_multi_turn_conversations_carry_the_targets_own_earlier_answers(tmp_path):
    chats = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first q"},
                          {"role": "assistant", "content": "written answer 1"},
                          {"role": "user", "content": "second q"}, {"role": "assistant", "content": "written 2"}]},
            {"messages": [{"role": "user", "content": "weather?"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                          {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "sunny"}]}]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items, left_out = rg.items_from_dataset([chats])
    assert [i.id for i in items] == ["chats.jsonl:1"] and left_out == {"tool_use": 1, "no_user_turn": 0, "leading_assistant_turns": 0,
                                                                "consecutive_assistant_turns": 0,
                                                                "turns_beyond_max_turns": 0}
    server = StandInServer()
    s = rg.GenSettings(model="m", max_tokens=8)
    rg.regenerate(rg.plan(items, s, tmp_path / "out"), "http://x.invalid", progress=False,
                  transport=httpx.MockTransport(server))
    assert [m["content"] for m in server.bodies[1]["messages"]] == ["be brief", "first q", "m says 1: first q",
                                                                    "second q"]
    out = json.loads((tmp_path / "out" / rg.DATASET).read_text())
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert "written" not in json.dumps(out)


def test_prepare_trains_on_the_answers_and_carries_the_generation_manifest(tmp_path, monkeypatch):
    from test_prepare_turns import PLAIN_TEMPLATE, CharTokenizer  # the stand-in tokenizer of the prepare tests

    from eagle3ops.config.pipeline import load_pipeline_config
    from eagle3ops.stages import prepare as prepare_stage
    from eagle3ops.stages.manifest import stage_dir

    run = tmp_path / "run"
    man = _run(run / rg.HOST_FOLDER, StandInServer())  # as uploaded: <run>/regenerated/dataset.jsonl
    (run / "pipeline.yaml").write_text(json.dumps({"target_model": "/m", "prepare": {
        "datasets": [f"{rg.HOST_FOLDER}/{rg.DATASET}"], "shuffle": False}}))
    monkeypatch.setattr(prepare_stage, "load_tokenizer", lambda _t: CharTokenizer(PLAIN_TEMPLATE))
    figures = prepare_stage.run_prepare(run, load_pipeline_config(run), log=lambda _m: None)
    samples = prepare_stage.read_samples(run)
    trained = "".join(chr(t) for t, m in zip(samples[0]["input_ids"], samples[0]["loss_mask"]) if m)
    assert figures["samples"] == 5 and f"m says 1: {PROMPTS[0].text[:12]}" in trained
    recorded = json.loads((stage_dir(run, "prepare") / "manifest.json").read_text())["generation"]
    assert recorded == {str(run / rg.HOST_FOLDER / rg.DATASET): man}
    assert prepare_stage.generation_manifests([run / rg.HOST_FOLDER / rg.ANSWERS]) == {}


def test_humaneval_training_prompts_are_the_complement_of_the_gate_split():
    from eagle3ops.speculate.ship import gate_prompts

    he = humaneval_train(None)
    gate = {p.id for p in gate_prompts(1000)}
    train = {i.id for i in he.items}
    assert train and gate and not train & gate and len(train | gate) == 164
    assert he.record["disjointness"]["overlap"] == [] and he.record["disjointness"]["gate_prompts"] == len(gate)
    assert he.record["train_ids"] == [i.id for i in he.items]
    assert len(humaneval_train(4).items) == 4


def test_the_api_key_comes_from_the_serving_container_and_never_from_argv():
    from types import SimpleNamespace

    from eagle3ops.config import load_inventory
    from eagle3ops.remote import Result

    h = load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")
    inspect = [{"Config": {"Cmd": ["/m", "--port", "18000"], "Env": ["PATH=/bin", "VLLM_API_KEY=s3cret"]}}]
    calls: list[list[str]] = []

    def run(argv, **_):
        calls.append(list(argv))
        return Result(list(argv), 0, json.dumps(inspect))

    assert reach.serving_api_key(SimpleNamespace(host=h, run=run)) == "s3cret"
    assert calls and not any("s3cret" in a for c in calls for a in c)


@pytest.mark.sandbox
@pytest.mark.timeout(300)
def test_regenerate_humaneval_prompts_with_the_sandboxs_live_vllm(deployed, tmp_path):
    """Four HumanEval train prompts answered by the sandbox's live target (greedy), once from the driver directly
    and once relayed on the host (the sandbox's sshd forbids the SSH forward: refused with the fixes, then relayed
    by the deployed pipeline image, under the host's lock); each answer is what a direct greedy request returns, the
    dataset is uploaded to the run dir, the lock is free again after each, and the manifest carries the settings."""
    from eagle3ops.commands import host as hc
    from eagle3ops.remote import Remote
    from eagle3ops.window.lock import read_lock

    h, _dep = deployed
    run = "test-regenerate"
    he = humaneval_train(4)
    settings = rg.settings_for(h, max_tokens=16, concurrency=2)
    mans = {}
    with Remote(h) as r:
        key = reach.serving_api_key(r)
        with pytest.raises(reach.ForwardRefused, match="AllowTcpForwarding local"):
            with reach.serving_endpoint(r, key, ssh_forward=True):
                pass
        for how, forward in (("direct", False), ("relayed", True)):
            p = rg.plan(he.items, settings, tmp_path / how)
            mans[how] = reach.regenerate_for_host(r, run, p, ssh_forward=forward, extra_manifest=he.record,
                                               progress=False, echo=lambda _m: None)
            assert read_lock(r) is None, how  # the upload's (and the relay's) hold of the lock released
        on_host = r.run(hc.cat_if_exists(mans["relayed"]["host_paths"]["manifest"])).stdout
        with reach.serving_endpoint(r, key) as (url, how):
            assert how.startswith("direct")
            direct = []
            for item in he.items:
                out = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                                 headers={"Authorization": f"Bearer {key}"} if key else {},
                                 json={"model": h.serving.served_model_name, "max_tokens": 16, "temperature": 0,
                                       "messages": [{"role": "user", "content": item.turns[0][1]}]}).json()
                direct.append(out["choices"][0]["message"]["content"])
        r.run(hc.rm_rf(f"{h.data_dir}/runs/{run}"))
    assert "direct" in mans["direct"]["endpoint"] and "relayed on the host" in mans["relayed"]["endpoint"]
    for how, man in mans.items():
        rows = [json.loads(x) for x in (tmp_path / how / rg.DATASET).read_text().splitlines()]
        answers = [row["messages"][-1]["content"] for row in rows]
        assert [row["id"] for row in rows] == [i.id for i in he.items]
        assert all(a.strip() for a in answers)
        assert answers == direct, how
        assert (man["answered"], man["failed"]) == (4, 0)
        assert man["settings"]["model"] == h.serving.served_model_name and man["settings"]["max_tokens"] == 16
        assert man["settings"]["temperature"] == 0.0 and man["settings"]["concurrency"] == 2
        assert man["vllm_version"] and man["vllm_version"].startswith("0.16"), how
        assert man["disjointness"]["overlap"] == [] and str(h.serving.port) in man["endpoint"]
    assert json.loads(on_host)["dataset_sha256"] == mans["relayed"]["dataset_sha256"]


def test_rows_relayed_from_the_host_reach_the_resume_log_as_they_stream(tmp_path):
    """The relay's output arrives in arbitrary chunks; each row line is logged when complete, the API key goes on
    stdin only, and the helper's failure names the fix."""
    from types import SimpleNamespace

    from eagle3ops.config import load_inventory
    from eagle3ops.remote import Result
    from eagle3ops.speculate.onhost import MARK, ROW_MARK

    h = load_inventory(Path(__file__).resolve().parents[1] / "deploy/hosts.yaml").host("sandbox")
    s = rg.GenSettings(model="m", max_tokens=8, concurrency=2)
    seen: list[int] = []

    def run(argv, *, stdin, stream, **_):
        req = json.loads(stdin)
        assert "regenerate" in argv and "s3cret" not in " ".join(argv) and req["api_key"] == "s3cret"
        with httpx.Client(transport=httpx.MockTransport(StandInServer())) as c:
            rows = [rg.answer_item(c, "http://x.invalid", rg.GenSettings(**req["settings"]),
                                   rg.Item(i["id"], tuple(map(tuple, i["turns"])))) for i in req["items"]]
        out = "noise\n" + "".join(ROW_MARK + json.dumps(r) + "\n" for r in rows) + MARK + '{"rows": 5}\n'
        for k in range(0, len(out), 7):
            stream(out[k:k + 7])
            seen.append(len((tmp_path / rg.ANSWERS).read_text().splitlines()))
        return Result(list(argv), 0, out)

    r = SimpleNamespace(host=h, run=run)
    man = rg.regenerate(rg.plan(rg.items_from_prompts(PROMPTS), s, tmp_path), None, progress=False,
                        rows_from=reach.host_relay(r, "pipeline:x", "s3cret", s))
    assert (man["answered"], man["failed"]) == (5, 0) and seen[0] == 0 and seen[-1] == 5 and len(set(seen)) == 6
    assert "s3cret" not in (tmp_path / rg.ANSWERS).read_text() + (tmp_path / rg.MANIFEST).read_text()

    def broken(argv, **_):
        return Result(list(argv), 1, "", "No module named eagle3ops.speculate.onhost")

    with pytest.raises(rg.RegenerateError, match="deploy a pipeline image"):
        rg.regenerate(rg.plan(rg.items_from_prompts(PROMPTS), rg.GenSettings(model="m", max_tokens=9), tmp_path),
                      None, progress=False, rows_from=reach.host_relay(SimpleNamespace(host=h, run=broken), "p:x",
                                                                     None, s))


def test_dry_run_prints_the_plan_and_the_upload_and_sends_nothing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from eagle3ops import executor
    from eagle3ops.cli import app
    from recording_host import RecordingHost

    # the lock's reads answered by a recording host: the lock is free
    rec = RecordingHost(facts=lambda argv, _in: (1, "", "") if argv[:2] == ["test", "-d"] else None,
                        stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    inv = Path(__file__).resolve().parents[1] / "deploy/hosts.yaml"
    res = CliRunner().invoke(app, ["regenerate", "sandbox", "--run", "r-dry", "--limit", "3", "--max-tokens", "9",
                                   "--concurrency", "2", "--out", str(tmp_path / "out"), "-i", str(inv),
                                   "--dry-run"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "regenerate 3 conversations" in res.output and "3 to send" in res.output
    assert "max_tokens 9" in res.output and "concurrency 2" in res.output
    assert "tee /var/lib/eagle3ops-sandbox/" in res.output and "/runs/r-dry/regenerated/dataset.jsonl" in res.output
    assert not (tmp_path / "out").exists() and all(c.dry_run for c in rec.calls if c.kind != "read")
