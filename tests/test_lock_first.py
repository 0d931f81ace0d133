"""Every host-changing command takes the host's lock before its first change (ARCHITECTURE.md: facts → checks →
plan → lock → writes → launch).

Each command runs through the real CLI against a recording host (:mod:`recording_host`: the product's ``Remote``
over a stand-in transport that records every command with its kind and answers reads from a small table of facts).
The flow ends at the lock (``LockReached``); the test fails naming every change a host received before it.
``cycle`` is followed past its lock on production too: its acceptance step's changes on the work host must sit
inside that host's own deploy lock (the child commands of its other steps are STAND-INS there: recorded, not run).
A serving group's ``rollout``/``release``/``rollback`` reads every group host and changes none before the group lock
on its first host. ``recover`` takes the host's lock to start serving stopped outside a window, and resumes an
interrupted window only after reading that the window holds the lock. The host-changing commands that take no deploy
lock by design (``watch``: its own records; ``group promote|pause``: a request row for the driver that holds the group
lock) are checked for what they change, and that a refused one changes nothing. ``regenerate`` asks live serving
with no lock and uploads its dataset under the host's lock; relayed on the host (a helper container there), it
answers and uploads under one hold of the lock.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3ops.speculate import onhost
from recording_host import LockReached, RecordingHost, pre_lock_changes

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "deploy/hosts.yaml"
IMAGE, IMAGE_ID = "eagle3ops/pipeline:t", "sha256:" + "a" * 64
#: A speculative serving image the host does not hold: speculate pushes it.
ABSENT = "eagle3ops/serving:absent"
TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 512,
          "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4}
HEAD = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": 512,
        "transformer_layer_config": {"hidden_size": 64, "vocab_size": 512, "num_hidden_layers": 1,
                                     "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256},
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}


def _facts(argv: list[str], stdin: bytes):
    """The reads a command asks before its lock, answered as a healthy host with a deployed pipeline image."""
    last = argv[1] if argv[0] == "find" else argv[-1]  # a cat_if_exists names its file first
    if argv[:2] == ["test", "-d"] and last.endswith("/state/lock"):  # the lock is free
        return 1, "", ""
    if last.endswith("deployed.json"):
        return 0, json.dumps({"image": IMAGE, "image_id": IMAGE_ID}), ""
    if last == "inspect" and "eagle3ops.speculate.onhost" in argv:  # speculate's gate helper
        return 0, onhost.MARK + json.dumps({"head_config": HEAD, "shapes": {}, "target_config": TARGET,
                                            "train_manifest": {"offline_estimate": {"acceptance_length": 2.0}},
                                            "head_sha256": "ab" * 32,
                                            "disjointness": {"overlap": [], "contained_in_training": []}}), ""
    if ABSENT in argv and "inspect" in argv:  # not on the host: the push sends it
        return 1, "", f"Error: No such image: {ABSENT}"
    return None


def _push(rec: RecordingHost):
    """Stand-in for :func:`eagle3ops.deployer.push_image` (the push itself is tested in test_transfer*.py): the
    ``docker load`` it ends with, recorded on the host through the product's ``record_stream``."""
    from eagle3ops import executor
    from eagle3ops.commands import transfer as tc

    def push(image, host, **_):
        with executor.for_host(host) as r:
            r.record_stream(tc.load(host))
        return "pushed"
    return push


def _run(monkeypatch, rec: RecordingHost, *args: str):
    from eagle3ops import cli, deployer, executor

    monkeypatch.setattr(executor, "for_host", rec.for_host)
    monkeypatch.setattr(deployer, "push_image", _push(rec))
    return CliRunner().invoke(cli.app, [*args, "--inventory", str(INVENTORY)])


COMMANDS = [
    pytest.param(["extract", "sandbox"], id="extract"),
    pytest.param(["train", "sandbox"], id="train"),
    pytest.param(["release", "sandbox", "--arg", "--max-num-seqs", "--arg", "8"], id="release"),
    pytest.param(["rollback", "sandbox"], id="rollback"),
    pytest.param(["release", "sandbox", "--gate", "--arg", "--max-num-seqs", "--arg", "8"], id="release-gate"),
    pytest.param(["speculate", "sandbox", "--run", "r1", "--accept-low-power"], id="speculate"),
    pytest.param(["speculate", "sandbox", "--run", "r1", "--accept-low-power", "--force", "--head", "{head}"],
                 id="speculate-head-dir"),
    pytest.param(["speculate", "sandbox", "--run", "r1", "--accept-low-power", "--image", ABSENT], id="speculate-push"),
    pytest.param(["probe", "sandbox"], id="probe"),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_no_host_change_precedes_the_lock(monkeypatch, tmp_path, args):
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps(HEAD))
    rec = RecordingHost(facts=_facts)
    out = _run(monkeypatch, rec, *[a.replace("{head}", str(head)) for a in args])
    assert isinstance(out.exception, LockReached), (out.output, [c.cmd for c in rec.calls])
    early = pre_lock_changes(rec.calls)
    assert not early, "changes before the lock:\n" + "\n".join(early)


def _stateful(base):
    """Facts that keep what the command wrote (``tee``/``tee -a``) and answer it back (``cat``, ``find -exec cat``),
    the lock's details included, so that releasing the lock (``release_lock`` reads who holds it) is followed."""
    files: dict[str, str] = {}

    def facts(argv, stdin):
        if argv[0] == "tee":
            files[argv[-1]] = (files.get(argv[-1], "") if argv[1] == "-a" else "") + stdin.decode()
            return 0, "", ""
        path = argv[1] if argv[0] == "find" else argv[-1]
        if argv[0] in ("cat", "find") and path.endswith(("details.json", "audit.jsonl")):
            return (0, files[path], "") if path in files else (1, "", f"{path}: No such file")
        if "{{.Id}}" in argv and any(a.startswith("eagle3ops-supervisor-") for a in argv):
            return 1, "", "Error: No such object"  # no supervisor started
        return base(argv, stdin)

    facts.files = files
    return facts


def test_speculate_releases_its_lock_when_a_check_after_it_refuses(monkeypatch):
    """The inspect helper runs under the lock now; when its answer refuses the head (here a hidden size that does not
    fit the target), the lock is released and the audit says ``not started``; the order is lock → the results'
    folder → the helper → the release, and nothing of the window (plan, supervisor) was written."""

    def misfit(argv, stdin):
        if argv[-1] == "inspect" and "eagle3ops.speculate.onhost" in argv:
            code, out, err = _facts(argv, stdin)
            ans = onhost.parse_answer(out)
            ans["head_config"]["transformer_layer_config"]["hidden_size"] = 32
            return code, onhost.MARK + json.dumps(ans), err
        return _facts(argv, stdin)

    facts = _stateful(misfit)
    rec = RecordingHost(facts=facts, stop_at_lock=False)
    out = _run(monkeypatch, rec, "speculate", "sandbox", "--run", "r1", "--accept-low-power")
    assert out.exit_code == 1 and "hidden" in out.output, out.output
    cmds = [c.cmd for c in rec.calls]
    kinds = [c.kind for c in rec.calls]
    lock = kinds.index("lock", kinds.index("lock") + 1)  # the atomic mkdir, after the state dir's mkdir -p
    helper = next(i for i, c in enumerate(rec.calls) if c.kind == "launch")
    released = next(i for i, c in enumerate(cmds) if c.startswith("rm -rf -- ") and c.endswith("/state/lock"))
    assert lock < cmds.index(next(c for c in cmds if c.endswith("/runs/r1/speculate"))) < helper < released
    assert not pre_lock_changes(rec.calls)
    assert not any("plan.json" in c or "eagle3ops-supervisor-" in c and " run " in c for c in cmds)
    audit = [json.loads(x) for x in facts.files[next(p for p in facts.files if p.endswith("audit.jsonl"))].splitlines()]
    assert audit[-1]["outcome"] == "not started" and "hidden" in audit[-1]["error"]


def _regenerate(monkeypatch, tmp_path, facts, *, relay: bool = False):
    """``regenerate sandbox --run r1 --limit 2`` against the recording host with ``facts``; STAND-INS: the live
    serving (:class:`test_regenerate.StandInServer` behind httpx's ``MockTransport``, asked by the real
    :func:`eagle3ops.speculate.regenerate.regenerate`) and the endpoint the driver reaches it at. ``relay``: the
    host refuses the SSH forward instead, so the answers come from the relay helper container on the host (its
    output: the stand-in server's rows, as :func:`eagle3ops.speculate.onhost.regenerate` prints them). Returns the
    result, the recorder and the host's regenerated folder."""
    import contextlib
    import functools

    import httpx

    from eagle3ops.config import load_inventory
    from eagle3ops.speculate import reach
    from eagle3ops.speculate import regenerate as rg
    from test_regenerate import StandInServer

    def endpoint(r, key, **_):
        if relay:
            raise reach.ForwardRefused(f"{r.host.name}: the SSH forward was refused (stand-in)")
        yield "http://serving.invalid", "stand-in serving"

    def helper(argv, stdin):  # the relay helper's answer: one row line per item, then its answer line
        if argv[-2:] != ["eagle3ops.speculate.onhost", "regenerate"]:
            return facts(argv, stdin)
        req = json.loads(stdin)
        with httpx.Client(transport=httpx.MockTransport(StandInServer())) as c:
            rows = [rg.answer_item(c, "http://serving.invalid", rg.GenSettings(**req["settings"]),
                                   rg.Item(i["id"], tuple(map(tuple, i["turns"])))) for i in req["items"]]
        return 0, "".join(onhost.ROW_MARK + json.dumps(x) + "\n" for x in rows) + onhost.MARK + json.dumps(
            {"rows": len(rows), "vllm_version": "0.16.0-stand-in"}) + "\n", ""

    monkeypatch.setattr(reach, "serving_endpoint", contextlib.contextmanager(endpoint))
    monkeypatch.setattr(reach, "regenerate", functools.partial(
        rg.regenerate, transport=httpx.MockTransport(StandInServer())))
    rec = RecordingHost(facts=helper, stop_at_lock=False)
    out = _run(monkeypatch, rec, "regenerate", "sandbox", "--run", "r1", "--limit", "2", "--out",
               str(tmp_path / "out"))
    return out, rec, f"{load_inventory(INVENTORY).host('sandbox').data_dir}/runs/r1/regenerated"


def _window_holds_the_lock(held: dict[str, bool]):
    """``(lock path, facts)`` for the recording host: while ``held["on"]`` the sandbox's lock is taken by an extract
    window of ``ops@elsewhere`` (``mkdir`` fails, the details name it); otherwise the host answers as :func:`_facts`."""
    from eagle3ops.config import load_inventory

    lock = f"{load_inventory(INVENTORY).host('sandbox').state_dir}/lock"

    def facts(argv, stdin):
        if held["on"] and argv == ["mkdir", lock]:
            return 1, "", f"mkdir: cannot create directory '{lock}': File exists"
        if held["on"] and argv[:2] == ["test", "-d"] and argv[-1] == lock:
            return 0, "", ""
        if held["on"] and argv[:2] == ["find", f"{lock}/details.json"]:
            return 0, json.dumps({"window_id": "20990101T000000Z-extract-abcdef", "holder": "ops@elsewhere",
                                  "since": "2099-01-01T00:00:00+00:00", "command": "eagle3ops extract sandbox"}), ""
        return _facts(argv, stdin)

    return lock, facts


def test_regenerate_uploads_only_under_the_lock_and_a_held_lock_keeps_the_answers(monkeypatch, tmp_path):
    """``regenerate``: the answers are asked with no lock (live serving, no window: the long part); the dataset and
    its manifest are written into the run's folder only between the host's lock and its release (an extract window
    of that run reads the folder under the lock, so it never reads a half-written file). A lock held by a window:
    nothing is written, the command fails naming the holder, and the answers stay local: the rerun asks nothing
    again and only uploads."""
    held = {"on": True}
    lock, facts = _window_holds_the_lock(held)

    out, rec, folder = _regenerate(monkeypatch, tmp_path, facts)
    said = " ".join(out.output.split())
    assert out.exit_code == 1 and "ops@elsewhere" in said and "kept in" in said, out.output
    assert not [c.cmd for c in rec.calls if c.kind in ("change", "launch") and folder in c.cmd]
    assert len((tmp_path / "out" / "dataset.jsonl").read_text().splitlines()) == 2  # the answers, kept
    held["on"] = False
    out, rec, folder = _regenerate(monkeypatch, tmp_path, facts)
    assert out.exit_code == 0 and "(0 now, 2 resumed" in " ".join(out.output.split()), out.output
    assert not pre_lock_changes(rec.calls), pre_lock_changes(rec.calls)
    cmds = [c.cmd for c in rec.calls]
    lock_at = next(i for i, c in enumerate(rec.calls) if c.kind == "lock" and c.argv[1] != "-p")
    written = [i for i, c in enumerate(cmds) if folder in c]
    released = max(i for i, c in enumerate(cmds) if c == f"rm -rf -- {lock}")
    assert len(written) == 3 and lock_at < min(written) and max(written) < released, cmds
    assert rec.calls[written[1]].stdin == (tmp_path / "out" / "dataset.jsonl").read_bytes()


def test_regenerate_relayed_on_the_host_starts_its_helper_only_under_the_lock(monkeypatch, tmp_path):
    """``regenerate`` on a host that refuses the SSH forward: the answers come from a helper container on the host,
    which is a host change, so every change (the helper's start, the dataset's writes) sits between one taking of
    the host's lock and its release. A lock held by a window: no container is started and nothing written, the
    command fails naming the holder and the fixes; the rerun with the lock free answers all and uploads."""
    held = {"on": True}
    lock, facts = _window_holds_the_lock(held)

    out, rec, folder = _regenerate(monkeypatch, tmp_path, facts, relay=True)
    said = " ".join(out.output.split())
    assert out.exit_code == 1 and "ops@elsewhere" in said and "--endpoint" in said, out.output
    assert not [c.cmd for c in rec.calls if c.kind in ("change", "launch")], [c.cmd for c in rec.calls]
    held["on"] = False
    out, rec, folder = _regenerate(monkeypatch, tmp_path, facts, relay=True)
    assert out.exit_code == 0 and "(2 now, 0 resumed" in " ".join(out.output.split()), out.output
    assert not pre_lock_changes(rec.calls), pre_lock_changes(rec.calls)
    taken = [i for i, c in enumerate(rec.calls) if c.kind == "lock" and c.argv[1] != "-p"]
    released = [i for i, c in enumerate(rec.calls) if c.cmd == f"rm -rf -- {lock}"]
    helper = [i for i, c in enumerate(rec.calls) if c.kind == "launch" and c.argv[-1] == "regenerate"]
    written = [i for i, c in enumerate(rec.calls) if folder in c.cmd]
    assert len(taken) == len(released) == 1 and len(helper) == 1 and len(written) == 3, [c.cmd for c in rec.calls]
    assert taken[0] < helper[0] < min(written) and max(written) < released[0]
    assert len((tmp_path / "out" / "dataset.jsonl").read_text().splitlines()) == 2


def _stopped_serving(base):
    """Serving's container exists but was stopped outside a window (``/health`` unanswered) until ``docker start``
    starts it; then it runs and answers 200. No window on the host; the lock free until taken."""
    started = []

    def facts(argv, stdin):
        if "start" in argv and argv[0] == "docker":
            started.append(True)
            return 0, "", ""
        if argv[0] == "docker" and "ps" in argv and "--all" in argv:
            return 0, "vllm-serving\n", ""
        if argv[0] == "docker" and "{{.State.Status}}" in argv:
            return 0, "running\n" if started else "exited\n", ""
        if argv[0] == "curl":
            return 0, "200" if started else "000", ""
        if argv[:2] == ["ls", "-1"] and argv[-1].endswith("/state/windows"):
            return 0, "", ""
        return base(argv, stdin)
    return facts


def test_recover_starts_serving_stopped_outside_a_window_only_under_the_lock(monkeypatch):
    """``recover`` of serving stopped outside a window: the reads (the live container, ``/health``, the lock) first;
    the container's start, the wait for ``/health`` and the audit line under the host's lock, released after."""
    from eagle3ops.window import live

    monkeypatch.setattr(live, "POLL_S", 0.0)
    facts = _stateful(_stopped_serving(_facts))
    rec = RecordingHost(facts=facts, stop_at_lock=False)
    out = _run(monkeypatch, rec, "recover", "sandbox")
    assert out.exit_code == 0 and "serving is running and healthy" in out.output, out.output
    cmds = [c.cmd for c in rec.calls]
    start = next(i for i, c in enumerate(rec.calls) if c.kind == "launch" and " start vllm-serving" in c.cmd)
    lock = next(i for i, c in enumerate(rec.calls) if c.kind == "lock" and c.argv[1] != "-p")
    released = max(i for i, c in enumerate(cmds) if c.startswith("rm -rf -- ") and c.endswith("/state/lock"))
    assert lock < start < released, cmds
    assert not pre_lock_changes(rec.calls), pre_lock_changes(rec.calls)
    audit = [json.loads(x) for x in facts.files[next(p for p in facts.files if p.endswith("audit.jsonl"))].splitlines()]
    assert audit[-1]["command"] == "recover" and audit[-1]["outcome"] == "ok"
    assert lock < next(i for i, c in enumerate(cmds) if c.startswith("tee -a ") and c.endswith("audit.jsonl"))


def test_recover_of_an_interrupted_window_changes_nothing_until_it_read_that_the_window_holds_the_lock(monkeypatch):
    """``recover`` of an interrupted window takes no lock of its own: it resumes the window that holds it. Every
    change (the old result moved aside, the exited supervisor removed, the new one started) comes after the read
    that found the lock held by that very window; none at all when the lock is another window's."""
    wid, other = "20990101T000000Z-extract-abcdef", "20990101T000001Z-train-fedcba"
    plan = {"window_id": wid, "stages": [{"spec": {"image": IMAGE}}]}

    def holding(holder):
        def facts(argv, stdin):
            last = argv[1] if argv[0] == "find" else argv[-1]
            if argv[:2] == ["ls", "-1"] and last.endswith("/state/windows"):
                return 0, wid + "\n", ""
            if last.endswith("/lock/details.json"):
                return 0, json.dumps({"window_id": holder, "holder": "alice@laptop"}), ""
            if argv[:2] == ["test", "-d"] and last.endswith("/state/lock"):
                return 0, "", ""
            if last.endswith(f"/windows/{wid}/result.json"):  # its restore failed: serving not running
                return 0, json.dumps({"window_id": wid, "outcome": "failed", "serving_running": False}), ""
            if last.endswith(f"/windows/{wid}/plan.json"):
                return 0, json.dumps(plan), ""
            if argv[0] == "docker" and "ps" in argv and "--all" in argv:
                return 0, "vllm-serving\n", ""
            if argv[0] == "docker" and "{{.State.Status}}" in argv:
                return 0, "exited\n", ""
            if "{{.State.Running}} {{.State.Restarting}}" in argv:  # its supervisor exited
                return 0, "false false", ""
            if argv[0] == "curl":
                return 0, "000", ""
            return _facts(argv, stdin)
        return facts

    rec = RecordingHost(facts=holding(wid), stop_at_lock=False)
    out = _run(monkeypatch, rec, "recover", "sandbox", "--dry-run")
    assert out.exit_code == 0, (out.output, out.exception)
    changes = [i for i, c in enumerate(rec.calls) if c.kind in ("change", "launch", "lock")]
    assert any(f"eagle3ops-supervisor-{wid}" in rec.calls[i].cmd and rec.calls[i].kind == "launch"
               for i in changes), [c.cmd for c in rec.calls]
    alive = next(i for i, c in enumerate(rec.calls) if "{{.State.Running}} {{.State.Restarting}}" in c.argv)
    held = max(i for i, c in enumerate(rec.calls[:changes[0]]) if "/lock/details.json" in c.cmd)
    assert alive < held < changes[0], [c.cmd for c in rec.calls]  # relaunch's own read of the lock, then changes

    rec = RecordingHost(facts=holding(other), stop_at_lock=False)
    out = _run(monkeypatch, rec, "recover", "sandbox")
    assert out.exit_code == 1 and other in out.output, out.output
    assert not [c.cmd for c in rec.calls if c.kind != "read"]


# --- host-changing commands that take no deploy lock, by design: what they may change, and nothing before it ------

def test_a_watch_that_cannot_reach_serving_changes_nothing(monkeypatch):
    """``watch`` observes (its own lock is local, a rollback goes through a locked window) and writes only its own
    records under ``<state_dir>/watch/``: the records' folder once serving answered, so a watch refused at its
    checks (here: the endpoint does not answer) leaves the host as it found it."""
    rec = RecordingHost(facts=_facts, stop_at_lock=False)
    out = _run(monkeypatch, rec, "watch", "sandbox", "--duration", "1", "--interval", "1",
               "--endpoint", "http://127.0.0.1:9/unreachable")
    assert out.exit_code == 1 and "does not answer" in out.output, out.output
    assert any("/state/watch/state.json" in c.cmd for c in rec.calls)  # its facts were read
    assert not [c.cmd for c in rec.calls if c.kind != "read"]


@pytest.mark.parametrize("what", ["promote", "pause"])
def test_a_group_control_request_is_one_journal_row_and_nothing_else(monkeypatch, tmp_path, what):
    """``group promote|pause`` are requests to the rollout's driver, which holds the group lock (taking it would
    wait out the rollout they steer): the one change is the request's row appended to the rollout's journal on the
    group's first host; no balancer, serving or other host is touched."""
    from functools import partial

    from eagle3ops import cli, executor

    rec = RecordingHost(facts=partial(_group_facts, ended=False), stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, ["group", what, "chat", "--inventory", str(_group_inventory(tmp_path))])
    assert out.exit_code == 0, (out.output, out.exception)
    changes = [(c.host, c.cmd) for c in rec.calls if c.kind != "read"]
    assert [(h, c.split()[:2]) for h, c in changes] == [("sandbox", ["tee", "-a"])], changes
    assert changes[0][1].endswith("/groups/chat/rollouts/r0/journal.jsonl")
    row = json.loads(rec.calls[-1].stdin)
    assert (row["step"], row["event"]) == ("control", what), row


# --- commands over two hosts ----------------------------------------------------------------------------------------

class _StreamReached(Exception):
    """A bulk stream (OpenSSH, outside ``Remote``) was about to start: recorded, and the flow ends here."""


def _two_hosts(tmp_path: Path) -> Path:
    """The repository's inventory with a second host ``other`` (the sandbox's entry under another name)."""
    import yaml

    data = yaml.safe_load(INVENTORY.read_text())
    data["hosts"]["other"] = dict(data["hosts"]["sandbox"])
    for key in ("identity_file", "known_hosts"):  # relative to the inventory's folder
        data["hosts"]["sandbox"][key] = data["hosts"]["other"][key] = str(
            (INVENTORY.parent / data["hosts"]["sandbox"][key]).resolve())
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump(data))
    return inv


def _streams(monkeypatch, rec: RecordingHost) -> None:
    """Stand-in for :class:`eagle3ops.transfer.streams.SshStream` where the weights' copy makes one: the receiving
    command is recorded as a change on its host (the stream is the transfer), then the flow ends."""
    from eagle3ops.transfer import weights as tw
    from recording_host import Call, render

    def stream(host, argv, **_):
        rec.calls.append(Call(host.name, "change", render(argv), list(argv)))
        raise _StreamReached(host.name)

    monkeypatch.setattr(tw, "SshStream", stream)


HEAD_FILE_SHA = "cd" * 32


def _two_host_facts(argv, stdin):
    last = argv[1] if argv[0] == "find" else argv[-1]
    if last.endswith("/runs/r1/train/manifest.json"):  # the run's train manifest on the host that trained it
        return 0, json.dumps({"files": {"final/config.json": {"bytes": 10, "sha256": HEAD_FILE_SHA}}}), ""
    if argv[0] == "find" and "-printf" in argv and argv[1].endswith("tiny-llama"):  # the weights on either host
        return 0, "4 1700000000.0 config.json\n", ""
    if argv[0] == "find" and argv[1].endswith("/runs/r1/extract/hidden"):  # the training host's own shard's file
        return 0, f"{'01' * 32}  {argv[1]}/0.pt\n", ""
    if argv[0] == "df":  # 50 GB free
        return 0, "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/x 99999999 1 50000000 1% /\n", ""
    if argv[:2] == ["sh", "-c"] and "e3-weights-hash" in argv:  # sha256 of named files
        return 0, "".join(f"{'ef' * 32} {p}\n" for p in argv[argv.index("e3-weights-hash") + 2:]), ""
    return _facts(argv, stdin)


MULTI = [
    pytest.param(["weights", "other", "--from", "sandbox"], id="weights-from"),
    pytest.param(["speculate", "other", "--run", "r1", "--accept-low-power", "--head", "sandbox:r1"],
                 id="speculate-head-host-run"),
    pytest.param(["extract", "sandbox", "other", "--run", "r1", "--pipeline", "{pipeline}"], id="fleet-extract"),
    pytest.param(["train", "sandbox", "--run", "r1", "--from-fleet", "{merged}", "--pipeline", "{pipeline}"],
                 id="train-from-fleet"),
]

#: A fleet run's merged manifest whose second sample's hidden states are on ``other`` (``train --from-fleet`` copies
#: them to the training host).
FLEET_MERGED = {"fleet": {"shards": [{"rank": 0, "host": "sandbox", "start": 0, "end": 1},
                                     {"rank": 1, "host": "other", "start": 1, "end": 2}]},
                "sample_files": [{"i": 0, "file": "hidden/0.pt"}, {"i": 1, "file": "hidden/1.pt"}],
                "files": {"hidden/0.pt": {"bytes": 4, "sha256": "01" * 32},
                          "hidden/1.pt": {"bytes": 4, "sha256": "02" * 32}}}


@pytest.mark.parametrize("args", MULTI)
def test_no_host_change_precedes_the_lock_over_two_hosts(monkeypatch, tmp_path, args):
    """Commands that read one host and change another: no host gets a change before its own lock."""
    from eagle3ops import cli, executor

    rec = RecordingHost(facts=_two_host_facts)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    _streams(monkeypatch, rec)
    (tmp_path / "p.yaml").write_text("target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_seq_len: 256, "
                                     "max_samples: 8}\n")
    (tmp_path / "merged.json").write_text(json.dumps(FLEET_MERGED))
    args = [a.replace("{pipeline}", str(tmp_path / "p.yaml")).replace("{merged}", str(tmp_path / "merged.json"))
            for a in args]
    out = CliRunner().invoke(cli.app, [*args, "--inventory", str(_two_hosts(tmp_path))])
    assert isinstance(out.exception, (LockReached, _StreamReached)) or out.exit_code == 0, \
        (out.output, [c.cmd for c in rec.calls])
    # both reached before the lock (train --from-fleet: only the training host; the sources stream under its lock)
    assert {c.host for c in rec.calls} == ({"sandbox"} if "--from-fleet" in args else {"sandbox", "other"}), \
        [c.cmd for c in rec.calls]
    early = pre_lock_changes(rec.calls)
    assert not early, "changes before the lock:\n" + "\n".join(early)


def test_a_head_from_another_host_is_fetched_under_the_lock_and_a_failed_fetch_releases_it(monkeypatch, tmp_path):
    """``speculate B --head A:RUN``: the fetch is planned before the lock (reads of both hosts) and made after it, on
    B; a fetch that fails (here the stand-in stream ends the flow) leaves B's lock released."""
    from eagle3ops import cli, executor

    rec = RecordingHost(facts=_stateful(_two_host_facts), stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    _streams(monkeypatch, rec)
    out = CliRunner().invoke(cli.app, ["speculate", "other", "--run", "r1", "--accept-low-power", "--head",
                                       "sandbox:r1", "--inventory", str(_two_hosts(tmp_path))])
    assert isinstance(out.exception, _StreamReached), (out.output, [c.cmd for c in rec.calls])
    calls = rec.of("other")
    lock = next(i for i, c in enumerate(calls) if c.kind == "lock" and c.argv[1] != "-p")
    fetch = next(i for i, c in enumerate(calls) if "e3-weights-receive" in c.argv)
    released = next(i for i, c in enumerate(calls)
                    if c.argv[:3] == ["rm", "-rf", "--"] and c.argv[-1].endswith("/lock"))
    assert lock < fetch < released and not pre_lock_changes(rec.calls)
    assert not [c for c in rec.of("sandbox") if c.kind != "read"]  # the source is only read


PREP = json.dumps({"samples": 2, "tokens": 10, "files": {"samples.jsonl": "ab" * 32}})
MERGED = {"fleet": {"shards": [{"rank": 0, "host": "sandbox", "start": 0, "end": 1},
                               {"rank": 1, "host": "other", "start": 1, "end": 2}]},
          "prepare_files": {"samples.jsonl": "ab" * 32}, "sample_files": [{"i": 0}, {"i": 1}], "tokens": 10}


def _nodes_facts(argv, stdin):
    """Two nodes that extracted their shards of run r1 and prepared the same samples."""
    last = argv[1] if argv[0] == "find" else argv[-1]
    if last.endswith("/runs/r1/prepare/manifest.json"):
        return 0, PREP, ""
    if "/runs/r1/extract/shards/" in last:
        return 0, json.dumps({"stage": "extract"}), ""
    return _facts(argv, stdin)


def test_a_multi_node_train_takes_every_nodes_lock_before_its_first_container(monkeypatch, tmp_path):
    """``train A B --from-fleet MERGED``: the reach probe and the cross-node trial start containers on every node;
    each node's lock comes first."""
    from eagle3ops import cli, executor

    merged, pipeline = tmp_path / "merged.json", tmp_path / "pipeline.yaml"
    merged.write_text(json.dumps(MERGED))
    pipeline.write_text("target_model: /model\nprepare: {datasets: [builtin:sharegpt], max_seq_len: 256}\n")
    rec = RecordingHost(facts=_nodes_facts)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, ["train", "sandbox", "other", "--run", "r1", "--from-fleet", str(merged),
                                       "--pipeline", str(pipeline), "--inventory", str(_two_hosts(tmp_path))])
    assert {c.host for c in rec.calls} == {"sandbox", "other"}, (out.output, [c.cmd for c in rec.calls])
    assert any(c.kind == "lock" for c in rec.calls) or any(c.kind == "launch" for c in rec.calls), out.output
    early = pre_lock_changes(rec.calls)
    assert not early, "changes before the lock:\n" + "\n".join(early)


def _deploy_standins(monkeypatch):
    """STAND-INS for the build of ``deploy`` (tested in test_images*.py and by the sandbox's deploy): the build plan
    (its tag and labels) and the built image, so that the flow reaches the host with no build engine work."""
    from types import SimpleNamespace

    from eagle3ops import images

    plan = SimpleNamespace(name="pipeline", base="eagle3ops/base:t", base_labels={}, tag=IMAGE, labels={},
                           profile="p", build_args={}, exists=True, lines=lambda: [f"# build pipeline: {IMAGE}"])
    monkeypatch.setattr(images, "plan_build", lambda *a, **k: plan)
    monkeypatch.setattr(images, "build_image", lambda *a, **k: images.BuiltImage(IMAGE, IMAGE_ID, 1, 0.0, {}))


def _venv_inventory(tmp_path: Path) -> Path:
    """The repository's inventory with a venv host ``pod`` (the sandbox's entry, ``stage_runtime: venv``)."""
    import yaml

    inv = _two_hosts(tmp_path)
    data = yaml.safe_load(inv.read_text())
    pod = {k: v for k, v in data["hosts"]["other"].items() if k in (
        "hostname", "port", "user", "identity_file", "known_hosts", "data_dir", "state_dir", "model_path")}
    pod.update(stage_runtime="venv", venv_python="/usr/bin/python3", serving="none")
    data["hosts"] = {"sandbox": data["hosts"]["sandbox"], "pod": pod}
    inv.write_text(yaml.safe_dump(data))
    return inv


def _env_tarball(tmp_path: Path) -> Path:
    """A pipeline environment tarball (one text file: no compiled file for another machine, no stand-in marker)."""
    import io
    import tarfile

    tgz = tmp_path / "env.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        data = b"a pipeline environment\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return tgz


@pytest.mark.parametrize("runtime", ["container", "venv"])
def test_deploy_makes_no_change_before_the_lock_and_releases_it_when_a_step_under_it_fails(monkeypatch, tmp_path,
                                                                                          runtime):
    """``deploy``: the reads (reach, the environment's marker and machine) and the build first; the image's push
    (``docker load``) or the environment's upload come after the host's lock. Followed past the lock (the image id
    read after the push is not the built one on this host of few facts; an upload the host refuses): the lock is
    released, last, and no ``deployed.json`` is written."""
    from eagle3ops import cli, deployer, executor

    _deploy_standins(monkeypatch)
    facts = _stateful(_facts)
    if runtime == "venv":
        args = ["deploy", "pod", "--env-tarball", str(_env_tarball(tmp_path)), "--inventory",
                str(_venv_inventory(tmp_path))]

        def answer(argv, stdin):
            if argv[:1] == ["uname"]:
                return 0, "x86_64\n", ""
            if "eagle3ops-receive-env" in argv:
                return 3, "", "sha256 mismatch"
            return facts(argv, stdin)
    else:
        args = ["deploy", "sandbox", "--inventory", str(INVENTORY)]
        answer = facts
    for stop in (True, False):
        rec = RecordingHost(facts=answer, stop_at_lock=stop)
        monkeypatch.setattr(executor, "for_host", rec.for_host)
        monkeypatch.setattr(deployer, "push_image", _push(rec))
        out = CliRunner().invoke(cli.app, args)
        early = pre_lock_changes(rec.calls)
        assert not early, "changes before the lock:\n" + "\n".join(early)
        if stop:
            assert isinstance(out.exception, LockReached), (out.output, [c.cmd for c in rec.calls])
            continue
        changes = [c for c in rec.calls if c.kind != "read"]
        assert out.exit_code == 1, (out.output, [c.cmd for c in changes])
        sent = [c for c in changes if c.kind == "change" and c.argv[:3] != ["rm", "-rf", "--"]
                and not c.cmd.endswith("details.json")]
        assert sent, [c.cmd for c in changes]  # the push or the upload was made, under the lock
        assert changes[-1].argv[:3] == ["rm", "-rf", "--"] and changes[-1].argv[-1].endswith("/lock"), \
            [c.cmd for c in changes]
        assert not any(c.cmd.endswith("deployed.json") for c in changes), [c.cmd for c in changes]


#: A STAND-IN image on the build engine for ``push`` (``FROM scratch`` and one file: nothing in it runs).
PUSHED = "eagle3ops-test/lock-first:1"


@pytest.fixture(scope="module")
def pushed_image(tmp_path_factory) -> str:
    """:data:`PUSHED`, built on the build engine (a second, once)."""
    from eagle3ops import executor

    ctx = tmp_path_factory.mktemp("lock-first-image")
    (ctx / "hello.txt").write_text("a stand-in layer, pushed under the lock\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /hello.txt\n")
    here = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    executor.engine(timeout=120).images.build(path=str(ctx), tag=PUSHED, rm=True, platform=f"linux/{here}")
    return PUSHED


def push_facts(argv, stdin):
    """A host's engine that holds no image (its inventory: ``docker info`` of this machine's architecture, no image
    line): the push loads the whole image; the rest as :func:`_two_host_facts` (50 GB free)."""
    from eagle3ops.commands import transfer as tc

    if "eagle3ops-inventory" in argv:
        info = {"Driver": "overlay2", "ServerVersion": "27.0", "Architecture": platform.machine(), "DriverStatus": []}
        return 0, json.dumps(info) + "\n" + tc.INVENTORY_SEPARATOR + "\n", ""
    return _two_host_facts(argv, stdin)


def test_push_takes_each_hosts_lock_before_loading_and_a_held_lock_fails_the_push(monkeypatch, tmp_path,
                                                                                  pushed_image):
    """``push IMAGE A B``: each host's facts (its image inventory) are read and its plan made before its lock; the
    ``docker load`` comes after it. A host whose lock a window holds fails, naming that window's holder and
    command, and receives no change."""
    from eagle3ops import cli, executor

    inv = _two_hosts(tmp_path)
    rec = RecordingHost(facts=push_facts)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, ["push", pushed_image, "sandbox", "other", "--attempts", "1",
                                       "--inventory", str(inv)])
    assert isinstance(out.exception, LockReached), (out.output, [c.cmd for c in rec.calls])
    assert not pre_lock_changes(rec.calls), pre_lock_changes(rec.calls)
    assert {c.host for c in rec.calls if c.kind == "lock" and c.argv[1] != "-p"} == {"sandbox", "other"}
    for name in ("sandbox", "other"):  # each host's facts first
        assert "eagle3ops-inventory" in rec.of(name)[0].argv, [c.cmd for c in rec.of(name)]

    held = {"window_id": "20990101T000000Z-extract-abcdef", "holder": "ops@elsewhere", "since": "2099-01-01",
            "command": "eagle3ops extract other"}

    def locked(argv, stdin):  # `other` is locked by a window
        if argv[:1] == ["mkdir"] and argv[-1].endswith("/state/lock"):
            return 1, "", "mkdir: cannot create directory: File exists"
        if argv[:1] == ["find"] and argv[1].endswith("/lock/details.json"):
            return 0, json.dumps(held), ""
        if argv[:2] == ["test", "-d"] and argv[-1].endswith("/state/lock"):
            return 0, "", ""
        return push_facts(argv, stdin)

    rec = RecordingHost(facts=locked, stop_at_lock=False)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, ["push", pushed_image, "other", "--attempts", "1", "--inventory", str(inv)])
    assert out.exit_code == 1, (out.output, [c.cmd for c in rec.calls])
    text = " ".join(out.output.split())
    assert "ops@elsewhere" in text and "eagle3ops extract other" in text, text
    assert not [c.cmd for c in rec.calls if c.kind in ("change", "launch")], [c.cmd for c in rec.calls]


def test_a_window_refused_under_a_lock_its_caller_took_releases_it(monkeypatch):
    """``run_window(held=...)``: the release refusals run again under the caller's lock, and a refusal there (a
    process host asked for a new image) releases it, as any failure before the supervisor starts does."""
    from eagle3ops.config import load_inventory
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.window.common import WindowError
    from eagle3ops.window.run import run_window, under_lock

    h = load_inventory(INVENTORY).host("sandbox")
    h = h.model_copy(update={"serving": type(h.serving)(kind="process", process_match="vllm serve",
                                                        served_model_name="m", port=8000)})
    facts = _stateful(_facts)
    rec = RecordingHost(facts=facts, stop_at_lock=False)
    r = rec.for_host(h)
    with under_lock(r, "20990101T000000Z-release-abcdef", "t"):
        pass  # the caller's own writes
    taken = len(rec.calls)
    with pytest.raises(WindowError, match="serves with a process"):
        run_window(r, kind="release", image=IMAGE, expected_image_id=None, command="t",
                   change=ReleaseChange(image="other:1"), held="20990101T000000Z-release-abcdef")
    after = [c.cmd for c in rec.calls[taken:]]
    assert any(c.startswith("rm -rf -- ") and c.endswith("/state/lock") for c in after), after
    audit = facts.files[next(p for p in facts.files if p.endswith("audit.jsonl"))]
    assert json.loads(audit.splitlines()[-1])["outcome"] == "not started"


# --- serving groups: the group lock on the group's first host before any host is changed -------------------------

def _group_inventory(tmp_path: Path) -> Path:
    """The two-host inventory with group ``chat`` (sandbox, other) behind an HAProxy reached from sandbox's shell."""
    import yaml

    inv = _two_hosts(tmp_path)
    data = yaml.safe_load(inv.read_text())
    data["groups"] = {"chat": {"hosts": ["sandbox", "other"], "max_out": 1, "balancer": {
        "kind": "haproxy", "socket": "/run/haproxy/admin.sock", "host": "sandbox", "backend": "vllm"}}}
    inv.write_text(yaml.safe_dump(data))
    return inv


def _group_facts(argv, stdin, *, ended: bool = True):
    """Both hosts deployed; the group's newest rollout (r0, a release to ``k1``) finished ``done`` and each host's
    marker on it (what ``group rollback`` returns from); ``rollout``/``release`` plan a new target over them. Not
    ``ended``: r0 stopped with sandbox switched and other drained, its driver gone (the group lock is free)."""
    from eagle3ops.group.rollout import plan_rollout

    last = argv[1] if argv[0] == "find" else argv[-1]
    if last.endswith("/groups/chat/current.json"):
        return 0, json.dumps({"id": "r0"}), ""
    if last.endswith("/groups/chat/rollouts/r0/plan.json"):
        plan = plan_rollout("chat", ["sandbox", "other"], 1, "release", "k1", "args --max-num-seqs 4",
                            {"sandbox": False, "other": False})
        return 0, json.dumps(plan.to_json()), ""
    if last.endswith("/groups/chat/rollouts/r0/journal.jsonl"):
        rows = [{"step": "rollout", "event": "end", "outcome": "done"}] if ended else [
            {"step": k, "event": "done", **({"release": 4, "previous": 3} if k.endswith(":switch") else {})}
            for k in ("sandbox:drain", "sandbox:switch", "sandbox:health", "sandbox:acceptance", "sandbox:undrain",
                      "other:drain")]
        return 0, "".join(json.dumps({"t": "x", **r}) + "\n" for r in rows), ""
    if argv[:2] == ["test", "-d"] and last.endswith("/groups/chat/lock"):  # no driver holds the group lock
        return 1, "", ""
    if last.endswith("/groups/chat/live.json"):
        return 0, json.dumps({"target": "k1", "release": 4, "previous": {}}), ""
    return _two_host_facts(argv, stdin)


GROUP = [
    pytest.param(["group", "rollout", "chat", "--run", "r1", "--accept-low-power"], id="group-rollout"),
    pytest.param(["group", "release", "chat", "--arg", "--max-num-seqs", "--arg", "8"], id="group-release"),
    pytest.param(["group", "rollback", "chat"], id="group-rollback"),
    pytest.param(["group", "abort", "chat"], id="group-abort-no-driver"),
]


@pytest.mark.parametrize("args", GROUP)
def test_no_host_change_precedes_the_group_lock(monkeypatch, tmp_path, args):
    """``group rollout|release|rollback``: each group host's facts (its marker, its release, its deployed image) are
    read with dry-run executors; the first change any host receives is the group lock on the group's first host
    (``<state_dir>/groups/chat/lock``), taken before the balancer or any host is touched. ``group abort`` of a
    rollout whose driver is gone returns its hosts itself: its request too is journaled only under that lock."""
    from functools import partial

    from eagle3ops import cli, executor

    rec = RecordingHost(facts=partial(_group_facts, ended=args[1] != "abort"))
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, [*args, "--inventory", str(_group_inventory(tmp_path))])
    assert isinstance(out.exception, LockReached), (out.output, out.exception, [c.cmd for c in rec.calls])
    lock = rec.calls[-1]
    assert (lock.host, lock.kind) == ("sandbox", "lock") and lock.cmd.endswith("/state/groups/chat/lock"), lock
    assert {c.host for c in rec.calls if c.kind == "read"} == {"sandbox", "other"}  # every host's facts read
    if args[1] != "abort":  # the planners read each host's marker; abort's plan is the journal's
        assert any("/groups/chat/live.json" in c.cmd and c.host == "other" for c in rec.calls)
    early = pre_lock_changes(rec.calls)
    assert not early, "changes before the group lock:\n" + "\n".join(early)


def test_the_lock_check_sees_a_change_before_the_group_lock(monkeypatch, tmp_path):
    """The same flow with one host change made before the lock (a marker's folder on ``other``, as a switch makes
    it): the check names it; the group's folder made on sandbox just before its lock is part of the lock."""
    from eagle3ops import cli, executor
    from eagle3ops.commands import host as hc
    from eagle3ops.config import load_inventory
    from eagle3ops.group import journal as gj

    inv = _group_inventory(tmp_path)
    rec = RecordingHost(facts=_group_facts)
    acquire = gj.GroupJournal.acquire

    def early(self, command, *, take_over=False):
        with rec.for_host(load_inventory(inv).host("other")) as r:
            r.run(hc.mkdir_p(f"{r.host.state_dir}/groups/chat"))
        return acquire(self, command, take_over=take_over)

    monkeypatch.setattr(executor, "for_host", rec.for_host)
    monkeypatch.setattr(gj.GroupJournal, "acquire", early)
    out = CliRunner().invoke(cli.app, ["group", "rollback", "chat", "--inventory", str(inv)])
    assert isinstance(out.exception, LockReached), (out.output, out.exception)
    found = pre_lock_changes(rec.calls)
    assert len(found) == 1 and found[0].startswith("other: mkdir -p ") and found[0].endswith("/groups/chat"), found


# --- the cycle: production's cycle lock first, the acceptance server on a work host under that host's lock ----------

def _cycle_inventory(tmp_path: Path) -> Path:
    """The repository's inventory with a work host ``w1`` (the sandbox's entry, ``serving: none``, its own roots)."""
    import yaml

    data = yaml.safe_load(INVENTORY.read_text())
    sb = data["hosts"]["sandbox"]
    for key in ("identity_file", "known_hosts"):  # relative to the inventory's folder
        sb[key] = str((INVENTORY.parent / sb[key]).resolve())
    data["hosts"]["w1"] = {**sb, "serving": "none", "data_dir": "/w1/data", "state_dir": "/w1/state",
                           "model_path": "/w1/models/tiny-llama", "docker_host": "unix:///w1/docker.sock"}
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump(data))
    return inv


def _cycle_args(tmp_path: Path) -> list[str]:
    pipe = tmp_path / "pipeline.yaml"
    pipe.write_text("target_model: /model\nprepare: {datasets: [regenerated/dataset.jsonl], max_seq_len: 256}\n")
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    return ["cycle", "sandbox", "--work", "w1", "--run", "r1", "--pipeline", str(pipe), "--dataset", str(chats),
            "--inventory", str(_cycle_inventory(tmp_path))]


def _upto_cycle_lock(calls: list) -> tuple[int, list[str]]:
    """The index of the cycle's lock (its atomic ``mkdir``) on production, and every change or launch any host
    received before it."""
    at = next((i for i, c in enumerate(calls) if c.kind == "lock" and c.argv[1] != "-p" and "/cycles/" in c.cmd),
              None)
    assert at is not None, [c.cmd for c in calls]
    return at, [f"{c.host}: {c.cmd}" for c in calls[:at] if c.kind in ("change", "launch")]


def test_no_host_change_precedes_the_cycles_lock(monkeypatch, tmp_path):
    """``cycle PROD --work W``: its facts (production's restarts and regenerated manifests, the weights plan of both
    hosts, the work host's extract rates and trained runs) are read with dry-run executors; nothing on production or
    on the work host is changed (no write, no container) before the cycle's lock on production."""
    from eagle3ops import cli, executor

    rec = RecordingHost(facts=_two_host_facts)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, _cycle_args(tmp_path), env={"COLUMNS": "300"})
    assert isinstance(out.exception, LockReached), (out.output, [c.cmd for c in rec.calls])
    at, early = _upto_cycle_lock(rec.calls)
    assert rec.calls[at].host == "sandbox" and rec.calls[at].cmd.endswith("/cycles/r1/lock")
    assert {c.host for c in rec.calls[:at]} == {"sandbox", "w1"}  # both hosts' facts were read
    facts = rec.calls[:at - 1]  # before the lock's folder (mkdir -p) and the lock
    assert facts and all(c.kind == "read" and c.dry_run for c in facts), \
        [f"{c.host}: {c.cmd} ({c.kind}, dry run {c.dry_run})" for c in facts if not (c.kind == "read" and c.dry_run)]
    assert not early, "changes before the cycle's lock:\n" + "\n".join(early)


def test_the_cycles_json_plan_is_all_of_stdout(monkeypatch, tmp_path):
    """``cycle PROD --work W --dry-run --json``: stdout is the plan's JSON document alone (a script reads it with
    ``json.loads``); the commands the facts were read with are echoed to stderr."""
    from eagle3ops import cli, executor

    rec = RecordingHost(facts=_two_host_facts)
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    out = CliRunner().invoke(cli.app, [*_cycle_args(tmp_path), "--dry-run", "--json"], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    assert plan["production"] == "sandbox" and plan["work"] == ["w1"]
    assert "/cycles/r1/journal.jsonl" in out.stderr  # the facts' reads, said where they do not mix with the plan


#: Production's serving as its release 3 recorded it (the container form the acceptance step replays on w1).
RECORD = {"Name": "vllm-serving", "ImageId": IMAGE_ID, "Networks": {},
          "Config": {"Image": "eagle3ops/vllm-openai-local:v0.16.0", "Entrypoint": ["vllm", "serve"],
                     "Cmd": ["/models/tiny-llama", "--served-model-name", "tiny-llama", "--port", "18000"],
                     "Env": ["PATH=/usr/bin"], "Labels": {"io.eagle3ops.role": "serving"}},
          "HostConfig": {"NetworkMode": "host", "RestartPolicy": {"Name": "unless-stopped"},
                         "Binds": ["/var/lib/x/data/models/tiny-llama:/models/tiny-llama:ro"]}}
#: The steps an earlier run of the cycle finished (journaled ``done``): this run starts at the acceptance.
DONE_BEFORE = ("regenerate", "weights:w1", "extract", "train")
#: Production's regenerated dataset of run r1 and its manifest (the cycle's ``dataset`` step copies both to w1).
DATASET = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"


def _cycle_run(monkeypatch, tmp_path, w1_lock_free: bool = True):
    """``cycle sandbox --work w1 --run r1`` carried out against recording hosts from the dataset step on (the journal
    answers regenerate, weights, extract and train done; the dataset step and the acceptance step run). STAND-INS:
    the child steps' runner (records the step, runs nothing: each child command's own lock order is tested above),
    the health wait and the replay (:func:`measure_served`: a verdict of 2.0), the image push (its ``docker load``
    recorded on w1). Returns (result, recorder, files)."""
    from eagle3ops import cli, cycle_cli, deployer, executor, health
    from eagle3ops.config import load_inventory
    from eagle3ops.speculate import cyclerun
    from recording_host import Call

    args = _cycle_args(tmp_path)
    inv = load_inventory(Path(args[args.index("--inventory") + 1]))
    journal = f"{inv.host('sandbox').state_dir}/cycles/r1/journal.jsonl"
    regen = f"{inv.host('sandbox').data_dir}/runs/r1/regenerated"
    files = {journal: "".join(json.dumps({"t": "2026-01-01T00:00:00+00:00", "step": k, "event": "done"}) + "\n"
                              for k in DONE_BEFORE),
             f"{regen}/dataset.jsonl": DATASET,
             f"{regen}/dataset.manifest.json": json.dumps({"dataset_sha256": _sha(DATASET)})}
    w1_lock = f"{inv.host('w1').state_dir}/lock"
    rec = RecordingHost(stop_at_lock=False)

    def facts(argv, stdin):
        if argv[0] == "tee":
            files[argv[-1]] = (files.get(argv[-1], "") if argv[1] == "-a" else "") + stdin.decode()
            return 0, "", ""
        path = argv[1] if argv[0] == "find" else argv[-1]
        if argv[0] == "find" and path in files:
            return 0, files[path], ""
        if argv[:2] == ["sh", "-c"] and "e3-weights-hash" in argv and argv[-1] == "dataset.jsonl":  # as copied
            d = argv[argv.index("e3-weights-hash") + 1]
            return 0, f"{_sha(files.get(f'{d}/dataset.jsonl', ''))} dataset.jsonl\n", ""
        if argv == ["mkdir", w1_lock] and not w1_lock_free:  # an extract window holds w1
            return 1, "", f"mkdir: cannot create directory '{w1_lock}': File exists"
        if argv[:2] == ["test", "-d"] and argv[-1] == w1_lock:
            return (1, "", "") if w1_lock_free else (0, "", "")
        if path == f"{w1_lock}/details.json" and not w1_lock_free:
            return 0, json.dumps({"window_id": "20990101T000000Z-extract-abcdef", "holder": "ops@elsewhere",
                                  "since": "2099-01-01T00:00:00+00:00", "command": "eagle3ops extract w1"}), ""
        if path.endswith("/releases/current"):
            return 0, "3\n", ""
        if path.endswith("/releases/0003.json"):
            return 0, json.dumps({"container": RECORD}), ""
        if "{{.Id}}" in argv and "image" in argv:  # w1 holds the image only once pushed
            on_w1 = "unix:///w1/docker.sock" in argv
            pushed = any(c.host == "w1" and "load" in c.argv for c in rec.calls)
            return (0, IMAGE_ID + "\n", "") if pushed or not on_w1 else (1, "", "Error: No such image")
        if "{{json .Config}}" in argv:
            return 1, "", "Error: No such image"  # production's live image's defaults unread: the record's kept
        return _two_host_facts(argv, stdin)

    rec.facts = facts
    monkeypatch.setattr(executor, "for_host", rec.for_host)
    monkeypatch.setattr(deployer, "push_image", _push(rec))

    def step(s):  # STAND-IN: the child command recorded, not run
        rec.calls.append(Call(s.hosts[0], "step", " ".join(s.argv), list(s.argv)))
        return {}

    monkeypatch.setattr(cycle_cli, "_argv_runner", lambda *a: step)
    monkeypatch.setattr(health, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(cyclerun, "measure_served", lambda url, model, prompts, floor, **k: {
        "mean_acceptance_length": 2.0, "floor": floor, "passed": True, "where": k["where"]})
    return CliRunner().invoke(cli.app, args, env={"COLUMNS": "300"}), rec, files


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _at(calls, pred, what: str) -> int:
    hits = [i for i, c in enumerate(calls) if pred(c)]
    assert hits, f"no {what} in " + "\n".join(f"{c.host}: {c.cmd}" for c in calls)
    return hits[0]


def test_the_cycles_acceptance_changes_its_work_host_only_under_both_locks(monkeypatch, tmp_path):
    """The acceptance step's own changes on the work host (the image pushed, the server's folder and private env
    file written, the server started and removed) come after the cycle's lock on production, and inside the work
    host's own deploy lock, taken for the step and released after the server is removed: a concurrent ``extract
    w1`` (or any window there) is refused rather than starting a stage on the GPUs the measuring server holds."""
    out, rec, files = _cycle_run(monkeypatch, tmp_path)
    assert out.exit_code == 0, (out.output, [f"{c.host}: {c.cmd}" for c in rec.calls])
    calls = rec.calls
    at, early = _upto_cycle_lock(calls)
    assert not early, "changes before the cycle's lock:\n" + "\n".join(early)
    w1 = [(i, c) for i, c in enumerate(calls) if c.host == "w1"]
    # the dataset step's copy: after the cycle's lock; it writes the cycle's own run dir only (no GPU, no port), so
    # it takes no host lock (a window of another run there does not hold it up)
    copied = [i for i, c in w1 if c.kind == "change" and "/w1/data/runs/r1/regenerated" in c.cmd]
    assert len(copied) == 3 and at < min(copied) and files["/w1/data/runs/r1/regenerated/dataset.jsonl"] == DATASET
    changes = [i for i, c in w1 if c.kind in ("change", "launch") and i not in copied]
    load = _at(calls, lambda c: c.host == "w1" and "load" in c.argv, "image push")
    env = _at(calls, lambda c: c.host == "w1" and c.cmd.endswith("/cycles/r1/serve/env"), "private env file")
    run = _at(calls, lambda c: c.host == "w1" and c.kind == "launch", "server start")
    removed = max(i for i, c in w1 if "rm" in c.argv and "--force" in c.argv)  # the server removed, last
    lock = _at(calls, lambda c: c.host == "w1" and c.kind == "lock" and c.argv[1] != "-p", "w1's lock")
    released = max(i for i, c in w1 if c.argv[:3] == ["rm", "-rf", "--"] and c.argv[-1].endswith("/w1/state/lock"))
    assert at < lock < min(changes) and {load, env, run} <= set(changes), [calls[i].cmd for i in changes]
    assert lock < load < env < run < removed < released == max(changes)  # nothing of the step outside w1's lock
    rest = [c for i, c in enumerate(calls) if i not in copied]
    assert not pre_lock_changes(rest), pre_lock_changes(rest)
    assert "acceptance" in files[next(p for p in files if p.endswith("details.json") and "/w1/" in p)]
    speculate = _at(calls, lambda c: c.kind == "step" and " speculate " in f" {c.cmd} ", "speculate step")
    assert released < speculate  # w1 is free again before production's speculate (its child locks both)
    events = [json.loads(x) for x in files[next(p for p in files if p.endswith("journal.jsonl"))].splitlines()]
    assert any(e["step"] == "acceptance" and e["event"] == "done" and e["mean_acceptance_length"] == 2.0
               and e["stopped"].startswith("container ") for e in events), events


def test_a_work_host_locked_by_another_window_fails_the_acceptance_step_before_any_change(monkeypatch, tmp_path):
    """w1 locked by an extract window: the acceptance step fails naming that window's holder and command; nothing is
    pushed, written or started on w1 (the dataset step's copy into the run's own dir aside); the cycle's lock on
    production is released and the step journaled failed (a rerun resumes there)."""
    out, rec, files = _cycle_run(monkeypatch, tmp_path, w1_lock_free=False)
    assert out.exit_code == 1 and "ops@elsewhere" in out.output and "eagle3ops extract w1" in out.output, out.output
    assert not [c.cmd for c in rec.of("w1") if c.kind in ("change", "launch") and "/runs/r1/regenerated" not in c.cmd]
    assert rec.calls[-1].host == "sandbox" and rec.calls[-1].cmd.endswith("/cycles/r1/lock")  # released, last
    ev = [json.loads(x) for x in files[next(p for p in files if p.endswith("journal.jsonl"))].splitlines()]
    assert (ev[-1]["step"], ev[-1]["event"]) == ("acceptance", "failed")
