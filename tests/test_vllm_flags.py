"""A vLLM upgrade's flag changes from both parsers (``eagle3ops.images.vllmflags``): the pure diff on small dumps,
then the two real images' dumps committed under tests/data/vllm-parser/ (written by scripts/vllm_parser_dumps.py,
which runs each image's own ``vllm serve`` parser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.images.vllmflags import FlagChange, argv_flags, diff_parsers, flag_report

DATA = Path(__file__).resolve().parent / "data" / "vllm-parser"


def _opt(flags: list[str], dest: str, default=None, type_="int", choices=None, nargs=None) -> dict:
    return {"flags": flags, "dest": dest, "default": default, "nargs": nargs, "type": type_, "choices": choices,
            "action": "_StoreAction"}


OLD = {"schema": 1, "vllm": "0.16.0", "options": [
    _opt(["--block-size"], "block_size", 16),
    _opt(["--disable-log-requests"], "disable_log_requests", False, None),
    _opt(["--max-model-len"], "max_model_len"),
    _opt(["--swap-space"], "swap_space", 4),
    _opt(["--task"], "task", "auto", "str", ["auto", "generate"]),
    _opt(["-O", "--compilation-config"], "compilation_config", "{}", "str"),
]}
NEW = {"schema": 1, "vllm": "0.32.0", "options": [
    _opt(["--block-size"], "block_size", None),
    _opt(["--enable-log-requests"], "disable_log_requests", True, None),
    _opt(["--max-model-len"], "max_model_len"),
    _opt(["--task"], "task", "auto", "str", ["auto", "generate", "embed"]),
    _opt(["-cc", "--compilation-config"], "compilation_config", "{}", "str"),
], "parse": {"ok": False, "error": "unrecognized arguments: --swap-space 8"}}


def test_the_diff_names_removed_renamed_and_redefaulted_flags() -> None:
    got = diff_parsers(OLD, NEW)
    assert got == [FlagChange("re-defaulted", "--block-size", 16, None),
                   FlagChange("renamed", "--disable-log-requests", ["--disable-log-requests"],
                              ["--enable-log-requests"]),
                   FlagChange("removed", "--swap-space")]
    # a choice added is not a change; a short alias changed is not one either (long flags are compared)
    assert [c.line() for c in got] == ["--block-size: default 16 -> None",
                                       "--disable-log-requests: renamed to --enable-log-requests",
                                       "--swap-space: removed"]
    narrowed = {**NEW, "options": [*NEW["options"][:3], _opt(["--task"], "task", "auto", "str", ["auto"])]}
    assert FlagChange("changed", "--task", "type 'str'", "type 'str'") not in diff_parsers(OLD, narrowed)
    assert [c.kind for c in diff_parsers(OLD, narrowed) if c.flag == "--task"] == ["changed"]
    with pytest.raises(ValueError, match="schema 2, expected 1: dump it again"):
        diff_parsers({**OLD, "schema": 2}, NEW)


def test_the_report_keeps_what_production_uses_and_the_new_parsers_verdict() -> None:
    argv = ["vllm", "serve", "/m", "--block_size=16", "--swap-space", "8", "--compilation-config.level", "0"]
    assert argv_flags(argv) == {"--block-size", "--swap-space", "--compilation-config"}
    rep = flag_report(OLD, NEW, argv)
    assert [c.flag for c in rep.used] == ["--block-size", "--swap-space"]
    assert rep.parse_ok is False and rep.lines() == [
        "vLLM flags 0.16.0 -> 0.32.0 (both parsers dumped from the images):",
        "  the new parser REFUSES production's command line: unrecognized arguments: --swap-space 8",
        "  used by production: --block-size: default 16 -> None",
        "  used by production: --swap-space: removed",
        "  all differences: 1 removed, 1 renamed, 1 re-defaulted, 0 changed"]
    assert json.loads(json.dumps(rep.as_dict()))["used"][1] == {"kind": "removed", "flag": "--swap-space",
                                                                 "old": None, "new": None}



OLD_ID, NEW_ID = "sha256:" + "1" * 64, "sha256:" + "2" * 64
NEW_IMAGE = "eagle3ops/vllm-openai-local:v0.32.0"


class _Res:
    def __init__(self, stdout: str = "", exited: int = 0):
        self.stdout, self.stderr, self.exited, self.ok = stdout, "", exited, exited == 0


class EngineStandIn:
    """STAND-IN for a host (its Docker engine as the flag check reads it; every other command answers nothing): a
    serving container running the sandbox demo's command line on the 0.16 image, and each image's parser answering
    with its committed dump (written by scripts/vllm_parser_dumps.py from the real images). Records the dump runs
    and what they got on stdin."""

    def __init__(self, host, dumps: dict[str, dict]):
        self.host, self.dry_run, self.dumps, self.runs, self.shm_reads = host, False, dumps, [], []
        self.spec = {"Image": OLD_ID, "Config": {"Entrypoint": ["vllm", "serve"], "Cmd": list(host.serving.args)}}

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        if argv[0] != "docker":  # the host's files (no recorded restarts), the results dir: nothing there
            return _Res("")
        a = list(argv)[1:]
        if a[0] == "-H":  # the host's engine endpoint (docker_host)
            a = a[2:]
        if a[0] == "ps":
            return _Res(self.host.serving.container + "\n")
        if a[:2] == ["container", "inspect"]:
            return _Res(json.dumps([self.spec]))
        if a[:2] == ["image", "inspect"] and "{{.Id}}" in a:
            return _Res({OLD_ID: OLD_ID, NEW_IMAGE: NEW_ID}[a[-1]] + "\n")
        if a[0] == "run":
            assert timeout and "--network" in a and a[a.index("--network") + 1] == "none"
            image = a[a.index("--entrypoint") + 2]
            if "shm_broadcast" in a[-1]:  # the /dev/shm reading: vLLM 0.32's MessageQueue defaults and check
                self.shm_reads.append(image)
                return _Res(json.dumps({"checks": True, "ring_bytes": 240 * 2**20}))
            self.runs.append((image, json.loads(stdin)))
            return _Res(json.dumps({**self.dumps[image], "parse": self.dumps[image]["parse"]
                                    if json.loads(stdin)["argv"] is not None else None}))
        return _Res("", exited=1)  # anything else (the architecture checks): not known, so not judged


def _real_dumps() -> tuple[dict, dict]:
    return (json.loads((DATA / "0.16.0.json").read_text()), json.loads((DATA / "0.32.0.json").read_text()))


def test_the_real_016_and_032_parsers_differ_where_the_dumps_say(tmp_path: Path) -> None:
    """The committed dumps of the real 0.16 and 0.32 images: each parsed the sandbox demo's command line in its
    own image; their diff has removed, renamed and re-defaulted flags; the demo's own flags are all still there."""
    old, new = _real_dumps()
    assert old["vllm"].startswith("0.16.0") and new["vllm"].startswith("0.32.0")
    assert old["parse"] == {"ok": True, "error": None} and old["argv"] == new["argv"]
    rep = flag_report(old, new, old["argv"])
    kinds = {c.kind for c in rep.changes}
    assert {"removed", "re-defaulted"} <= kinds, kinds
    assert rep.parse_ok is new["parse"]["ok"]
    demo = argv_flags(old["argv"])
    assert demo <= {f for o in new["options"] for f in o["flags"]}  # none of the demo's flags is gone
    # what the two parsers themselves say (vLLM 0.32 dropped --swap-space and --disable-log-requests, raised the
    # GPU memory default, and let --block-size take any integer: its CPU attention refuses 16 only at start-up)
    removed = {c.flag for c in rep.changes if c.kind == "removed"}
    assert {"--swap-space", "--disable-log-requests", "--disable-frontend-multiprocessing"} <= removed, removed
    assert FlagChange("re-defaulted", "--gpu-memory-utilization", 0.9, 0.92) in rep.changes
    assert [(c.kind, c.flag, c.new) for c in rep.used] == [("changed", "--block-size", "choices None")]


def test_release_gate_with_image_parses_production_argv_in_the_new_image_before_anything_runs(
        monkeypatch, tmp_path: Path) -> None:
    """``release --gate --image``: the live image's parser dumped (then cached by its id: not run again), the new
    image's parser run on production's command line with the --arg set (on stdin), the report printed and put in
    the job's figures; a command line the new parser refuses stops the release before any window."""
    from eagle3ops.config import load_inventory
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.speculate import gated, ship
    from eagle3ops.window import run as window_run

    monkeypatch.setenv("EAGLE3OPS_CACHE_DIR", str(tmp_path / "cache"))
    host = load_inventory(Path(__file__).resolve().parents[1] / "deploy/sandbox-smollm2.yaml").host("sandbox")
    old, new = _real_dumps()
    eng = EngineStandIn(host, {OLD_ID: old, NEW_IMAGE: new})
    windows, said = [], []
    monkeypatch.setattr(window_run, "run_window", lambda r_, **w: windows.append(w) or
                        {"outcome": "ok", "window_id": "w", "restarts_s": [], "speculate": {"verdict": "keep"}})
    change = ReleaseChange(args=["--max-num-seqs", "4"], image=NEW_IMAGE)
    assert new["parse"] == {"ok": True, "error": None}  # vLLM 0.32's own parser accepts the demo's command line
    gated.gated_release(eng, change, pipeline_image="p:1", pipeline_image_id=None, echo=said.append)
    flags = windows[0]["speculate"].figures["vllm_flags"]
    assert flags["parse_ok"] is True and flags["new_vllm"].startswith("0.32.0")
    assert [img for img, _ in eng.runs] == [OLD_ID, NEW_IMAGE]
    assert eng.runs[0][1] == {"argv": None}  # the live image: its options only
    assert eng.runs[1][1]["argv"] == ["vllm", "serve", *host.serving.args, "--max-num-seqs", "4"]
    assert said[:2] == ["vLLM flags 0.16.0 -> 0.32.0 (both parsers dumped from the images):",
                        "  the new parser accepts production's command line"]
    assert said[2].startswith("  used by production: --block-size: choices [") and said[3].startswith("  all diff")
    # a command line the new image's parser refuses (its error as argparse words it, quoting a value back): the
    # release stops before any window, the API key masked; the live image's dump came from the cache
    eng.runs.clear()
    windows.clear()
    eng.spec["Config"]["Cmd"] = [*host.serving.args, "--api-key", "sk-SECRET123"]
    eng.dumps[NEW_IMAGE] = {**new, "parse": {"ok": False, "error": "argument --api-key: invalid value: 'sk-SECRET123'"}}
    with pytest.raises(ship.SpeculateError, match=r"refuses production's command line \(argument --api-key") as e:
        gated.gated_release(eng, change, pipeline_image="p:1", pipeline_image_id=None, echo=said.append)
    assert "sk-SECRET123" not in str(e.value) and "Nothing was restarted" in str(e.value)
    assert windows == [] and [img for img, _ in eng.runs] == [NEW_IMAGE]


# --- the served tokenizer under both images (eagle3ops.speculate.tokenread) --------------------------------------


def test_tokenizer_path_and_its_host_path_from_the_command_line_and_binds() -> None:
    from eagle3ops.speculate.tokenread import host_path, tokenizer_path

    assert tokenizer_path(["vllm", "serve", "/models/m", "--port", "8000"]) == "/models/m"
    assert tokenizer_path(["/models/m", "--tokenizer", "/models/m/tok"]) == "/models/m/tok"
    assert tokenizer_path(["vllm", "serve", "--model=/models/x", "--dtype", "bf16"]) == "/models/x"
    assert tokenizer_path(["vllm", "serve", "--port", "1"]) is None
    binds = ["/data/models:/models:ro", "/data/m2:/models/m:ro", "/cache:/root/.cache/vllm"]
    assert host_path("/models/m/tok", binds) == "/data/m2/tok"  # the longest container prefix wins
    assert host_path("/models/other", binds) == "/data/models/other"
    assert host_path("HuggingFaceTB/SmolLM2-135M-Instruct", binds) is None
    assert host_path("/modelsX", binds) is None


class TokenizingEngineStandIn(EngineStandIn):
    """STAND-IN as :class:`EngineStandIn`, whose serving container binds the model directory and whose images answer
    the tokenizer reading with ``readings[image]`` (made-up ids; the real readings are the benchmark's:
    benchmarks/vllm-upgrade-gate/). Records each reading's image and mount."""

    def __init__(self, host, dumps: dict[str, dict], readings: dict[str, dict]):
        super().__init__(host, dumps)
        self.readings, self.reads = readings, []
        self.spec["Config"]["Image"] = host.serving.image
        self.spec["HostConfig"] = {"Binds": list(host.serving.volumes), "ShmSize": 2**30, "IpcMode": "private"}

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        a = list(argv)
        if a[0] == "docker" and "run" in a and "AutoTokenizer" in a[-1]:
            assert timeout and a[a.index("--network") + 1] == "none"
            image = a[a.index("--entrypoint") + 2]
            self.reads.append((image, a[a.index("-v") + 1]))
            return _Res("some warning\n" + json.dumps(self.readings[image]))
        return super().run(argv, check=check, timeout=timeout, stdin=stdin)


def test_release_gate_with_image_refuses_a_tokenizer_the_new_image_reads_otherwise(monkeypatch, tmp_path: Path) -> None:
    """``release --gate --image``: production's tokenizer as served today (the model directory, by the live image's
    transformers) against the release's (the model, or ``--tokenizer`` given with ``--arg``, by the new image's)
    before anything runs, through the container's bind; other ids refuse the release naming both classes, the same
    ids go into the job's figures."""
    from eagle3ops.config import load_inventory
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.speculate import gated, ship
    from eagle3ops.speculate.tokenread import SAMPLES
    from eagle3ops.window import run as window_run

    monkeypatch.setenv("EAGLE3OPS_CACHE_DIR", str(tmp_path / "cache"))
    host = load_inventory(Path(__file__).resolve().parents[1] / "deploy/sandbox-smollm2.yaml").host("sandbox")
    old, new = _real_dumps()
    ids = [[i, i + 1] for i in range(len(SAMPLES))]
    v16 = {"transformers": "4.57.6", "class": "LlamaTokenizerFast", "ids": ids}
    v32 = {"transformers": "5.19.0", "class": "LlamaTokenizer", "ids": [*ids[:1], [7, 7, 7], *ids[2:]]}
    eng = TokenizingEngineStandIn(host, {OLD_ID: old, NEW_IMAGE: new}, {host.serving.image: v16, NEW_IMAGE: v32})
    windows, said = [], []
    monkeypatch.setattr(window_run, "run_window", lambda r_, **w: windows.append(w) or
                        {"outcome": "ok", "window_id": "w", "restarts_s": [], "speculate": {"verdict": "keep"}})
    model_dir = host.serving.volumes[0].split(":")[0]
    with pytest.raises(ship.SpeculateError, match=r"reads differently under .*LlamaTokenizer\) than under the live "
                                                  r".*LlamaTokenizerFast\): 'def add") as e:
        gated.gated_release(eng, ReleaseChange(args=["--block-size=32"], image=NEW_IMAGE), pipeline_image="p:1",
                            pipeline_image_id=None, echo=said.append)
    assert "Nothing was restarted" in str(e.value) and windows == []
    assert eng.reads == [(host.serving.image, f"{model_dir}:/tokenizer:ro"), (NEW_IMAGE, f"{model_dir}:/tokenizer:ro")]
    # a --tokenizer both read alike (given with --arg, under the model's bind): released, the reading in the figures
    eng.reads.clear()
    eng.readings[NEW_IMAGE] = {**v32, "class": "PreTrainedTokenizerFast", "ids": ids}
    change = ReleaseChange(args=["--tokenizer", "/models/smollm2-135m-instruct/tok"], image=NEW_IMAGE)
    gated.gated_release(eng, change, pipeline_image="p:1", pipeline_image_id=None, echo=said.append)
    assert eng.reads == [(host.serving.image, f"{model_dir}:/tokenizer:ro"),
                         (NEW_IMAGE, f"{model_dir}/tok:/tokenizer:ro")]
    assert windows[0]["speculate"].figures["tokenizer"] == {
        "path": "/models/smollm2-135m-instruct/tok", "live_path": "/models/smollm2-135m-instruct", "same": True,
        "old": {"transformers": "4.57.6", "class": "LlamaTokenizerFast"},
        "new": {"transformers": "5.19.0", "class": "PreTrainedTokenizerFast"},
        "shm": {"ring_bytes": 240 * 2**20, "checks": True, "shm_bytes": 2**30, "ipc_mode": "private"}}
    assert eng.shm_reads == [NEW_IMAGE, NEW_IMAGE]


def test_release_gate_with_image_refuses_a_dev_shm_the_new_vllm_does_not_start_in(monkeypatch, tmp_path: Path
                                                                                  ) -> None:
    """``release --gate --image`` to a vLLM that checks its shared-memory ring at start-up (0.32): Docker's default
    64 MiB ``/dev/shm`` of the live container is refused before anything runs, naming both sizes and the key;
    ``--ipc host`` (the host's own ``/dev/shm``) is not judged; an image that does not check is not either."""
    from eagle3ops.config import load_inventory
    from eagle3ops.config.plan import ReleaseChange
    from eagle3ops.speculate import gated, ship
    from eagle3ops.speculate.shmread import shm_refusal
    from eagle3ops.speculate.tokenread import SAMPLES
    from eagle3ops.window import run as window_run

    monkeypatch.setenv("EAGLE3OPS_CACHE_DIR", str(tmp_path / "cache"))
    host = load_inventory(Path(__file__).resolve().parents[1] / "deploy/sandbox-smollm2.yaml").host("sandbox")
    same = {"transformers": "4.57.6", "class": "PreTrainedTokenizerFast", "ids": [[1]] * len(SAMPLES)}
    eng = TokenizingEngineStandIn(host, dict(zip((OLD_ID, NEW_IMAGE), _real_dumps())),
                                  {host.serving.image: same, NEW_IMAGE: same})
    eng.spec["HostConfig"]["ShmSize"] = 64 * 2**20
    windows = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, **w: windows.append(w) or
                        {"outcome": "ok", "window_id": "w", "restarts_s": [], "speculate": {"verdict": "keep"}})
    with pytest.raises(ship.SpeculateError, match=r"needs 240 MiB of /dev/shm .* the serving container has 64 MiB, "
                                                  r"which a release keeps\. Nothing was restarted: .*hosts\.sandbox\."
                                                  r"serving\.shm_size"):
        gated.gated_release(eng, ReleaseChange(image=NEW_IMAGE), pipeline_image="p:1", pipeline_image_id=None,
                            echo=lambda _: None)
    assert windows == [] and eng.shm_reads == [NEW_IMAGE]
    eng.spec["HostConfig"]["IpcMode"] = "host"
    gated.gated_release(eng, ReleaseChange(image=NEW_IMAGE), pipeline_image="p:1", pipeline_image_id=None,
                        echo=lambda _: None)
    assert len(windows) == 1
    assert shm_refusal("h", "i", {"checks": False, "ring_bytes": 240 * 2**20}, 64 * 2**20, "private") is None
    assert shm_refusal("h", "i", {"checks": True, "ring_bytes": 240 * 2**20}, 2**30, "private") is None


# --- speculate with a speculative image of another vLLM: the same checks, through the same entry point ----------


class LabelledEngineStandIn(TokenizingEngineStandIn):
    """STAND-IN as :class:`TokenizingEngineStandIn` whose images carry profile labels (``labels[image]``) and whose
    serving container answers the like-for-like read (``{{.Config.Image}} {{.Image}}``)."""

    def __init__(self, host, dumps: dict[str, dict], readings: dict[str, dict], labels: dict[str, str]):
        super().__init__(host, dumps, readings)
        self.labels, self.calls = labels, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        a = list(argv)
        self.calls.append(a)
        if a[0] == "docker" and "inspect" in a and "{{.Config.Image}} {{.Image}}" in a:
            return _Res(f"{self.spec['Config']['Image']} {OLD_ID}\n")
        if a[0] == "docker" and "image" in a and "inspect" in a and "--format" not in a:
            label = self.labels.get(a[-1])
            return _Res(json.dumps([{"Config": {"Labels": {"io.eagle3ops.profile": label} if label else {}}}]))
        return super().run(argv, check=check, timeout=timeout, stdin=stdin)


def test_speculate_with_an_image_of_another_vllm_runs_release_images_checks_before_any_restart(
        monkeypatch, tmp_path: Path) -> None:
    """``speculate --image`` of vLLM 0.32 on a host serving 0.16 (by the images' profile labels): the new image's
    parser reads production's command line with the ``--arg`` flags and the speculative config set, then ``/dev/shm``
    and the tokenizer are read, through ``release --image``'s own entry point; a tokenizer 0.32 reads otherwise is
    refused before any window or lock, naming the tokenizer and the fix. A speculative image of the live vLLM is not
    read at all."""
    from eagle3ops.config import load_inventory
    from eagle3ops.speculate import ship, upgrade
    from eagle3ops.speculate.tokenread import SAMPLES
    from eagle3ops.window import run as window_run

    monkeypatch.setenv("EAGLE3OPS_CACHE_DIR", str(tmp_path / "cache"))
    host = load_inventory(Path(__file__).resolve().parents[1] / "deploy/sandbox-smollm2.yaml").host("sandbox")
    ids = [[i, i + 1] for i in range(len(SAMPLES))]
    v16 = {"transformers": "4.57.6", "class": "LlamaTokenizerFast", "ids": ids}
    v32 = {"transformers": "5.19.0", "class": "LlamaTokenizer", "ids": [*ids[:1], [7, 7, 7], *ids[2:]]}
    labels = {OLD_ID: "vllm-0.16.0-serving-cpu-standin", NEW_IMAGE: "vllm-0.32.0-serving"}
    eng = LabelledEngineStandIn(host, dict(zip((OLD_ID, NEW_IMAGE), _real_dumps())),
                                {host.serving.image: v16, NEW_IMAGE: v32}, labels)
    monkeypatch.setattr(window_run, "run_window", lambda *a, **k: pytest.fail("a window ran"))
    said: list[str] = []
    opts = ship.SpeculateOptions(run="r1", pipeline_image="p:1", serving_image=NEW_IMAGE, control=True,
                                 args=("--block-size=32",))
    with pytest.raises(ship.SpeculateError, match=r"tokenizer at .* reads differently under .*LlamaTokenizer\).*"
                                                  r"Nothing was restarted: .*--arg=--tokenizer"):
        ship.speculate(eng, opts, echo=said.append)
    assert not any(c[:2] == ["mkdir", "-p"] or "mkdir" in c[:1] for c in eng.calls)  # no lock, nothing written
    parsed = eng.runs[-1][1]["argv"]  # the new image's parser over production's argv as the release will run it
    assert eng.runs[-1][0] == NEW_IMAGE and "--block-size" in host.serving.args  # production's --block-size 16
    assert "--block-size=32" in parsed and "--block-size" not in parsed  # ... replaced by the --arg
    spec_cfg = json.loads(parsed[parsed.index("--speculative-config") + 1])
    assert "disable_padded_drafter_batch" not in spec_cfg  # chosen by the image's vLLM: 0.32 takes the plain one
    assert eng.shm_reads == [NEW_IMAGE] and [img for img, _ in eng.reads] == [host.serving.image, NEW_IMAGE]
    assert any("serves vLLM 0.32.0, live serving 0.16.0" in m for m in said)
    # the same entry point, for a speculative image of live serving's vLLM: skipped, nothing read in an image
    eng.runs.clear(), eng.reads.clear(), eng.shm_reads.clear()
    change = ship.speculative_change(host, "/h", 3, "serving:016", None, "0.16.0")
    got = upgrade.speculate_checks(eng, change, "0.16.0", said.append)
    assert got["cross_version"]["checked"] is False and got["cross_version"]["live_vllm"]["vllm"] == "0.16.0"
    assert eng.runs == [] and eng.reads == [] and eng.shm_reads == []
