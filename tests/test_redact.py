"""The one redaction rule (:mod:`eagle3ops.redact`): which flags and environment names carry keys or tokens, and
every form they take in a command line, an environment and a JSON record; the inventory's ``secret_env`` names;
the driver's own outputs (the command line of the lock and the audit, ``config check``'s drift, the dry-run
preview) through the same rule. Pure and fast (no host, no sandbox)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
K = "sk-planted-0123"


def test_every_form_of_a_flag_carrying_a_key_is_masked():
    from eagle3ops import redact

    argv = ["vllm", "serve", "/m", "--api-key", K, "--api-key=" + K, "--hf-token", "hf_" + K, "--hf-token=hf_" + K,
            "--port", "8000"]
    out = redact.argv(argv)
    assert K not in json.dumps(out)
    assert out == ["vllm", "serve", "/m", "--api-key", "***", "--api-key=***", "--hf-token", "***",
                   "--hf-token=***", "--port", "8000"]
    # inside one argument holding a shell command line, and an environment assignment in front of it
    shell = ["bash", "-c", f"VLLM_API_KEY={K} HF_TOKEN='hf_{K}' exec vllm serve /m --api-key {K} --hf-token={K} -x"]
    out = redact.argv(shell)
    assert K not in json.dumps(out) and out[:2] == ["bash", "-c"]
    assert out[2] == "VLLM_API_KEY=*** HF_TOKEN=*** exec vllm serve /m --api-key *** --hf-token=*** -x"
    # a word that only looks alike is kept; a flag with no value is kept as it is
    assert redact.argv(["--api-keys-file", "/f", "--api-key"]) == ["--api-keys-file", "/f", "--api-key"]


def test_environment_values_of_secret_names_are_masked_in_every_shape():
    from eagle3ops import redact

    env = {"VLLM_API_KEY": K, "HF_TOKEN": K, "HUGGING_FACE_HUB_TOKEN": K, "ORG_TOKEN": K, "OMP_NUM_THREADS": "2"}
    assert redact.env(env) == {**{k: "***" for k in ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")},
                               "ORG_TOKEN": K, "OMP_NUM_THREADS": "2"}
    assert redact.env(env, ["ORG_TOKEN"])["ORG_TOKEN"] == "***"  # a name the inventory lists
    listed = [f"{k}={v}" for k, v in env.items()]
    assert redact.env(listed, ["ORG_TOKEN"]) == ["VLLM_API_KEY=***", "HF_TOKEN=***", "HUGGING_FACE_HUB_TOKEN=***",
                                                 "ORG_TOKEN=***", "OMP_NUM_THREADS=2"]
    assert redact.is_secret_env("HF_TOKEN") and redact.is_secret_env("ORG_TOKEN", ["ORG_TOKEN"])
    assert not redact.is_secret_env("ORG_TOKEN")


def test_a_whole_record_is_masked_deeply_and_its_shape_kept():
    """What the journal, results and audit lines hold: argv lists, ``K=V`` environment lists, environment
    mappings, free text (an error message quoting a command line)."""
    from eagle3ops import redact

    entry = {"step": "record", "argv": ["python3", "srv.py", "--api-key", K, "--hf-token=" + K],
             "environ": [f"VLLM_API_KEY={K}", f"ORG_TOKEN={K}", "PATH=/bin"],
             "change": {"args": ["--api-key", K], "env": {"HF_TOKEN": K, "NCCL_ALGO": "Ring"}},
             "reason": f"exit 1: sh -c 'vllm serve /m --api-key {K}'", "n": 3, "ok": True, "none": None}
    out = redact.value(entry, ["ORG_TOKEN"])
    assert K not in json.dumps(out)
    assert out["environ"][2] == "PATH=/bin" and out["change"]["env"]["NCCL_ALGO"] == "Ring"
    assert (out["n"], out["ok"], out["none"]) == (3, True, None) and out["argv"][:2] == ["python3", "srv.py"]
    assert entry["argv"][3] == K  # the input is left as it was


def test_inventory_secret_env_is_validated_documented_and_reaches_the_plan(tmp_path):
    from eagle3ops.config import ConfigError, load_inventory
    from eagle3ops.config.docs import docs
    from eagle3ops.window.planner import build_plan

    p = tmp_path / "hosts.yaml"
    base = "hosts:\n  h:\n    hostname: h\n    data_dir: /d\n    state_dir: /s\n    model_path: /m\n" \
           "    serving: {image: i, served_model_name: m}\n"
    p.write_text(base + "    secret_env: [ORG_TOKEN]\n")
    h = load_inventory(p).host("h")
    assert h.secret_env == ["ORG_TOKEN"]
    plan = build_plan(h, kind="window", window_id="w9", image="i", command="c", stages=["prepare"])
    assert plan.secret_env == ["ORG_TOKEN"]
    p.write_text(base + "    secret_env: ['not a name']\n")
    with pytest.raises(ConfigError, match=r"hosts\.h\.secret_env"):
        load_inventory(p)
    assert "secret_env" in docs("inventory") and "secret_env:" in (REPO / "deploy/hosts.yaml").read_text()


def test_the_drivers_own_outputs_go_through_the_rule(monkeypatch):
    """``config check``'s drift lines and the command line the lock and the audit keep: ``--hf-token`` and the
    inventory's names too, not only ``--api-key``."""
    from eagle3ops import cli_common
    from eagle3ops.commands import serving as sv
    from eagle3ops.config import load_inventory

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    live = {"Config": {"Image": h.serving.image, "Cmd": ["--hf-token", K, "--api-key=" + K], "Env": []},
            "HostConfig": {}}
    drift = "\n".join(sv.inventory_drift(h, live))
    assert K not in drift and "--hf-token" in drift
    monkeypatch.setattr(sys, "argv", ["eagle3ops", "release", "h", "--arg", "--hf-token", "--arg", K,
                                      "--arg=--hf-token=" + K, "--gate"])
    line = cli_common.command_line()
    assert K not in line and "--gate" in line


def test_no_second_copy_of_the_rule_is_left():
    """Every redaction goes through :mod:`eagle3ops.redact`: the older private copies are gone."""
    from eagle3ops.commands import serving as sv
    from eagle3ops.gate import like

    assert not hasattr(sv, "_redact_args") and not hasattr(like, "_KEY_IN_STRING")
    assert not hasattr(like, "redacted_argv")


class _Files:
    """A STAND-IN host reader for the driver's writers and readers: files from a dict (``find ... cat`` / ``ls``),
    every written stdin kept in ``wrote``."""

    def __init__(self, host, files: dict[str, str]):
        self.host, self.files, self.wrote = host, files, []

    def run(self, argv, *, check=True, stdin=None, **_):
        class Res:
            ok, stderr = True, ""
        res = Res()
        if argv[0] == "find":
            res.stdout = self.files.get(argv[1], "")
        elif argv[0] == "ls":
            root = argv[-1].rstrip("/") + "/"
            res.stdout = "".join(sorted({p[len(root):].split("/")[0] + "\n" for p in self.files if p.startswith(root)}))
        else:
            self.wrote.append(stdin or "")
            res.stdout = ""
        return res


def test_the_dry_run_echo_remote_errors_audit_lines_and_the_report_are_masked(capsys):
    """The driver's other outputs: ``--dry-run``'s echo of each command, a failed remote command's message, the
    audit lines the driver appends, and the run report's data (its HTML and plots are drawn from it), which reads
    the host's plans: those hold a release's and the stages' environment as given."""
    from eagle3ops import cli_common, report
    from eagle3ops.commands.quote import render
    from eagle3ops.config import load_inventory
    from eagle3ops.remote import RemoteCommandError
    from eagle3ops.window.common import append_audit

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    h = h.model_copy(update={"secret_env": ["ORG_TOKEN"]})
    cmd = ["docker", "run", "-e", f"ORG_TOKEN={K}", "-e", f"HF_TOKEN={K}", "img", "sh", "-c",
           f"vllm serve /m --api-key {K}", "--hf-token", K]
    cli_common.remote(h, dry_run=True).echo(render(cmd))
    out = capsys.readouterr().out
    assert K not in out and "ORG_TOKEN=***" in out and "docker run" in out
    err = str(RemoteCommandError(h, cmd, 1, f"--api-key\n{K}\n", ""))  # the process record prints one word a line
    assert K not in err and "exited 1" in err
    files = {f"{h.state_dir}/windows/w1/plan.json": json.dumps(
                 {"window_id": "w1", "kind": "release", "run": "default", "change": {"args": ["--api-key", K], "env": {"ORG_TOKEN": K}},
                  "stages": [{"spec": {"environment": {"HF_TOKEN": K}}}]}),
             f"{h.state_dir}/windows/w1/journal.jsonl": json.dumps({"step": "x", "event": "ok", "epoch": 1.0,
                                                                    "reason": f"--hf-token={K}"}) + "\n"}
    r = _Files(h, files)
    data = report.collect(r, h, "default")
    assert data["windows"] and K not in json.dumps(data)
    append_audit(r, {"command": "eagle3ops release sandbox", "error": f"exit 1: env ORG_TOKEN={K} vllm serve"})
    assert r.wrote and K not in "".join(r.wrote)
    from eagle3ops import console  # what `attach`/`status` print of a journal or result another version wrote

    console.print_event({"t": "2026-01-01T00:00:00", "step": "record", "event": "ok", "argv": ["--api-key", K]})
    console.summary({"window_id": "w1", "kind": "window", "outcome": "failed", "error": f"--hf-token={K}"})
    seen = capsys.readouterr()
    assert K not in seen.out + seen.err and "record" in seen.err


def test_the_offline_dry_run_prints_stage_and_serving_commands_masked():
    """``--dry-run --offline`` prints every stage's ``docker run`` (with ``stage_env``) and the serving container as
    the inventory describes it (with ``serving.env`` and ``serving.args``): secrets masked, the rest as it is."""
    from eagle3ops.config import load_inventory
    from eagle3ops.window.offline import offline_dry_run

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    s = h.serving.model_copy(update={"env": {**h.serving.env, "VLLM_API_KEY": K},
                                     "args": [*h.serving.args, "--hf-token", K]})
    h = h.model_copy(update={"serving": s, "secret_env": ["ORG_TOKEN"],
                             "stage_env": {**h.stage_env, "HF_TOKEN": K, "ORG_TOKEN": K}})
    lines: list[str] = []
    offline_dry_run(h, kind="extract", run="r", pipeline_text=(REPO / "deploy/pipeline.yaml").read_text(),
                    command="eagle3ops extract sandbox", echo=lines.append)
    text = "\n".join(lines)
    assert K not in text and "--env HF_TOKEN=***" in text and "--env ORG_TOKEN=***" in text
    assert "OMP_NUM_THREADS=2" in text  # what is not a secret is shown as it is


def test_a_stream_is_masked_line_by_line_whatever_its_chunks():
    """:class:`~eagle3ops.redact.LineWriter` (a stage's output on its way to its log): a secret cut between two
    chunks is masked once its line ends, a line redrawn with ``\\r`` is passed on at once, an unended last line at
    ``close``, a line longer than ``hold`` as it stands; bytes that are not UTF-8 are kept."""
    import io

    from eagle3ops import redact

    out = io.BytesIO()
    w = redact.LineWriter(out, ["ORG_TOKEN"], hold=64)
    w.write(b"args: --api-key " + K[:5].encode())
    assert out.getvalue() == b""  # held until its line ends
    w.write(K[5:].encode() + b" --port 8000\nORG_TOKEN=" + K.encode() + b" \xff\r 50%")
    assert out.getvalue() == b"args: --api-key *** --port 8000\nORG_TOKEN=*** \xff\r"
    w.write(b"|" * 70)  # no line end for longer than hold: passed on
    assert out.getvalue().endswith(b" 50%" + b"|" * 70)
    w.write(b" HF_TOKEN=" + K.encode())
    w.close()
    assert out.getvalue().endswith(b" HF_TOKEN=***") and K.encode() not in out.getvalue()
