"""The rented-host lifecycle, over real SSH: two engine-less sandbox hosts (:mod:`eagle3ops_dev.fleet`:
sandboxes ``pytest-rent0``/``pytest-rent1``, SSH 2260-2261, namespaces ``e3rent0``/``e3rent1``, 10.226.k.0/24,
veth links limited to 100 mbit by ``tc tbf``), host keys checked.

- ``eagle3ops weights rent1 --from rent0``: the weights manifest recorded on rent0 as a window starts it
  (:func:`eagle3ops.window.run.start_weights_record`); a missing model copied and verified; a differing file found and
  re-copied alone; an interrupted copy (a truncated ``.part`` on rent1) resumed, only the rest sent (bytes counted by
  the driver); a corrupted byte at the source refused by sha256 on rent1 (nothing renamed into place).
- ``--head rent0:RUN``: a run's final head on rent0 (its train manifest's sha256) fetched into rent1's
  ``<data_dir>/heads/<sha256[:12]>``, verified, its digest the one ``speculate --head DIR`` computes; a file whose
  bytes differ from the manifest refused. The speculate gate itself does not run here (it needs the pipeline image;
  these hosts have no engine): ``speculate rent1 --head rent0:RUN --dry-run`` prints the fetch, then is refused as
  speculate refuses any ``serving: none`` host.

The copy goes source → driver → destination (two OpenSSH streams), never from a hub."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

from eagle3ops.commands import host as hc
from eagle3ops.commands import process as pc
from eagle3ops.commands import weights as wc
from eagle3ops.remote import Remote
from eagle3ops.speculate.onhost import head_sha256
from eagle3ops.transfer.weights import PER_FILE_S
from eagle3ops.transfer.weightsplan import parse_hashes, parse_manifest
from eagle3ops.window.common import audit_entries
from eagle3ops.window.run import start_weights_record
from eagle3ops_dev import fleet

REPO = Path(__file__).resolve().parents[1]
NET = {"prefix": "pytest-rent", "ns_prefix": "e3rent", "subnet": 226}
SSH_PORT = 2260
CLI_TIMEOUT_S = 120
MIB = 1 << 20

pytestmark = [pytest.mark.sandbox]
#: This module brings up sandboxes of its own (sshd only, in namespaces): its tests run in the "rest" part.
OWN_SANDBOX = "pytest-rent0"


def _blob(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


#: The stand-in target's files (random bytes: the copy does not read them as a model).
FILES = {"config.json": b'{"hidden_size": 64}', "model-00001-of-00002.safetensors": _blob(1, 4 * MIB),
         "model-00002-of-00002.safetensors": _blob(2, 2 * MIB), "tokenizer/tokenizer.json": _blob(3, 300_000)}


@pytest.fixture(scope="module")
def rent(tmp_path_factory):
    """(hosts by name, inventory file, nodes): two nodes up, rent0 holding the stand-in weights, rent1 none."""
    tmp = tmp_path_factory.mktemp("rent")
    nodes = fleet.up(2, ssh_port=SSH_PORT, rate="100mbit", **NET)
    try:
        hosts = {f"rent{k}": fleet.venv_host(node, f"rent{k}", f"{node.info.data_dir}/rent-{os.getpid()}")
                 for k, node in enumerate(nodes)}
        for h in hosts.values():
            fleet.make_dirs(h)
        src = hosts["rent0"]
        with Remote(src) as r:
            r.run(hc.mkdir_p(f"{src.model_path}/tokenizer"))
        pw = pwd.getpwnam(nodes[0].info.user)  # written here (the sandbox's data dir is a folder of this machine)
        for name, data in FILES.items():
            f = Path(f"{src.model_path}/{name}")
            f.write_bytes(data)
            os.chown(f, pw.pw_uid, pw.pw_gid)
        with Remote(hosts["rent1"]) as r:
            r.run(hc.rm_rf(hosts["rent1"].model_path))  # a rented host: no weights yet
        inv = tmp / "hosts.yaml"
        inv.write_text(fleet.inventory_yaml(list(hosts.values())))
        yield hosts, inv, nodes
    finally:
        fleet.down(2, **NET)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3ops", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, cwd=REPO)


def _json_lines(out: str) -> list[dict]:
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def _hashes(h, root: str, names) -> dict[str, str]:
    with Remote(h) as r:
        return parse_hashes(r.run(wc.hash_files(root, sorted(names)), check=False).stdout)


def test_weights_copied_verified_rechecked_resumed_and_corruption_refused(rent):
    hosts, inv, nodes = rent
    src, dst = hosts["rent0"], hosts["rent1"]
    assert "rate 100Mbit" in nodes[1].link.qdisc()
    want = {n: hashlib.sha256(d).hexdigest() for n, d in FILES.items()}
    total = sum(len(d) for d in FILES.values())

    # the serving host's first window starts the recording (detached); it is there within a bounded wait
    with Remote(src) as r:
        assert start_weights_record(r) is True
        assert start_weights_record(r) is False  # started once, never twice
        mpath, deadline = wc.manifest_path(src.state_dir), time.monotonic() + 30
        while not r.run(hc.exists(mpath), check=False).ok:
            assert time.monotonic() < deadline, "the weights manifest was not recorded within 30 s"
            time.sleep(0.2)
        recorded = parse_manifest(r.run(hc.cat(mpath)).stdout, mpath)
    assert {p: e.sha256 for p, e in recorded.items()} == want

    # the plan, printed and nothing done
    dry = _cli("weights", "rent1", "--from", "rent0", "-i", str(inv), "--link-mbit", "100", "--dry-run")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    plan = next(p for p in _json_lines(dry.stdout) if "steps" in p)
    assert plan["send_bytes"] == total and {s["action"] for s in plan["steps"]} == {"copy"}
    assert plan["estimate_s"] == pytest.approx(total / 12.5e6 + len(FILES) * PER_FILE_S, abs=0.1)
    assert f"to send: {total / 1e6:.1f} MB" in dry.stdout
    assert not Path(dst.model_path).exists()  # a dry run copies nothing

    # 1. missing model: copied, each file verified on arrival; the destination's manifest recorded
    t0 = time.monotonic()
    run = _cli("weights", "rent1", "--from", "rent0", "-i", str(inv), "--link-mbit", "100")
    wall = time.monotonic() - t0
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    final = _json_lines(run.stdout)[-1]
    assert final["outcome"] == "ok" and final["sent_bytes"] == total
    assert _hashes(dst, dst.model_path, FILES) == want
    with Remote(dst) as r:
        assert parse_manifest(r.run(hc.cat(wc.manifest_path(dst.state_dir))).stdout, "rent1").keys() == FILES.keys()
        assert not r.run(hc.test_dir(f"{dst.state_dir}/lock"), check=False).ok  # the lock is released
        assert audit_entries(r)[-1]["outcome"] == "ok"
    print(f"\nweights copy: {total} bytes in {final['seconds']} s ({final['rate_mbit']} Mbit/s over the 100 mbit "
          f"link; plan's estimate {final['estimate_s']} s at 100 Mbit/s), CLI wall {wall:.1f} s")

    again = _cli("weights", "rent1", "--from", "rent0", "-i", str(inv))
    assert again.returncode == 0 and "the weights are there already" in again.stdout, again.stderr[-2000:]

    # 2. a differing file (same size, other bytes): found by its sha256 and re-copied alone
    tok = Path(dst.model_path) / "tokenizer/tokenizer.json"
    tok.write_bytes(_blob(99, 300_000))
    diff = _cli("weights", "rent1", "--from", "rent0", "-i", str(inv))
    assert diff.returncode == 0, diff.stdout[-2000:] + diff.stderr[-2000:]
    files = [f for f in _json_lines(diff.stdout) if "action" in f]
    assert [(f["path"], f["action"], f["bytes"]) for f in files] == [("tokenizer/tokenizer.json", "replace", 300_000)]
    assert _hashes(dst, dst.model_path, FILES) == want

    # 3. an interrupted copy: 1 MiB of a 4 MiB file in its .part file; only the rest is sent
    big = Path(dst.model_path) / "model-00001-of-00002.safetensors"
    part = big.with_name(big.name + wc.PART)
    big.rename(part)
    os.truncate(part, MIB)
    res = _cli("weights", "rent1", "--from", "rent0", "-i", str(inv))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    files = [f for f in _json_lines(res.stdout) if "action" in f]
    assert [(f["action"], f["offset"], f["bytes"]) for f in files] == [("resume", MIB, 3 * MIB)]
    assert _json_lines(res.stdout)[-1]["sent_bytes"] == 3 * MIB
    assert _hashes(dst, dst.model_path, FILES) == want and not part.exists()

    # 4. a corrupted byte: the source's file changed under its manifest (size and mtime kept, so the cheap check
    # trusts the record); the bytes arrive, their sha256 differs, rent1 refuses and renames nothing into place
    second = Path(src.model_path) / "model-00002-of-00002.safetensors"
    st = second.stat()
    data = bytearray(second.read_bytes())
    data[12345] ^= 0x01
    second.write_bytes(bytes(data))
    os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns))
    (Path(dst.model_path) / second.name).unlink()
    bad = _cli("weights", "rent1", "--from", "rent0", "-i", str(inv))
    assert bad.returncode == 1, bad.stdout[-2000:]
    assert "was refused: its sha256 on arrival differs from the source's manifest" in " ".join(bad.stderr.split())
    assert not (Path(dst.model_path) / second.name).exists()
    assert not (Path(dst.model_path) / (second.name + wc.PART)).exists()
    with Remote(dst) as r:
        assert not r.run(hc.test_dir(f"{dst.state_dir}/lock"), check=False).ok
        assert audit_entries(r)[-1]["outcome"] == "failed"
    data[12345] ^= 0x01  # put the byte back for the head test's source
    second.write_bytes(bytes(data))
    os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns))


def _put_head(h, run: str, files: dict[str, bytes], manifest_files: dict[str, bytes] | None = None) -> None:
    """A finished train stage on ``h``: ``runs/RUN/train/final/*`` and its manifest (sha256 of
    ``manifest_files``, default the files themselves)."""
    final = f"{h.data_dir}/runs/{run}/train/final"
    listed = manifest_files or files
    manifest = {"stage": "train", "files": {f"final/{n}": {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                            for n, d in listed.items()}}
    with Remote(h) as r:
        r.run(hc.mkdir_p(final))
        for n, d in files.items():
            r.run(hc.write_file(f"{final}/{n}"), stdin=d)
        r.run(hc.write_file(f"{h.data_dir}/runs/{run}/train/manifest.json"), stdin=json.dumps(manifest))


def test_head_from_another_host_fetched_verified_installed_and_a_bad_file_refused(rent, tmp_path, capsys):
    from eagle3ops import weights_cli

    hosts, inv, _ = rent
    src, dst = hosts["rent0"], hosts["rent1"]
    head = {"config.json": b'{"speculators_model_type": "eagle3"}', "model.safetensors": _blob(7, 1 * MIB)}
    _put_head(src, "h1", head)
    for n, d in head.items():
        (tmp_path / n).write_bytes(d)
    digest = head_sha256(tmp_path)  # what `speculate --head DIR` would compute from the same files

    with Remote(dst) as r:
        got = weights_cli.head_for(inv, r, Path("rent0:h1"))
    assert got.digest == digest and got.dir == f"{dst.data_dir}/heads/{digest[:12]}" and str(got) == "rent0:h1"
    assert _hashes(dst, got.dir, head) == {n: hashlib.sha256(d).hexdigest() for n, d in head.items()}
    assert "installed at rent1:" in capsys.readouterr().out
    with Remote(dst) as r:  # installed already: nothing sent again
        again = weights_cli.head_for(inv, r, Path("rent0:h1"))
    assert again == got and "to send: 0 B" in capsys.readouterr().out

    # the CLI: --head HOST:RUN is fetched (dry run: planned), then speculate goes on as with --head DIR (here it
    # refuses, as for any `serving: none` host, after the fetch's plan was printed)
    cli = _cli("speculate", "rent1", "--run", "h1", "--head", "rent0:h1", "-i", str(inv), "--dry-run")
    assert "would be installed at rent1:" in cli.stdout, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert cli.returncode == 1 and "host rent1 has no serving" in " ".join(cli.stderr.split())

    # a file whose bytes differ from the run's train manifest: refused on arrival, nothing installed
    bad = {**head, "model.safetensors": _blob(8, 1 * MIB)}
    _put_head(src, "h2", bad, manifest_files={**head, "model.safetensors": _blob(9, 1 * MIB)})
    with Remote(dst) as r, pytest.raises(typer.Exit):
        weights_cli.head_for(inv, r, Path("rent0:h2"))
    cap = capsys.readouterr()
    err = " ".join((cap.out + cap.err).split())
    assert "model.safetensors was refused: its sha256 on arrival differs" in err


def test_cycle_dry_run_plans_from_what_the_hosts_hold_and_writes_nothing(rent, tmp_path):
    """``cycle rent0 --work rent1 --dry-run --json``: the plan's weights step is ``weights --dry-run``'s own copy
    plan (bytes, seconds), production's restarts come from its (absent) records, bounded by its health gate, and
    nothing is written on production (no journal, no lock). rent0 is made production here by an inventory that gives
    it a ``process`` serving (the dry run reads; nothing serves)."""
    hosts, inv, _ = rent
    prod = hosts["rent0"].model_copy(update={"serving": hosts["rent0"].serving.model_validate(
        {"kind": "process", "process_match": "standin_openai_server.py --port 18999", "port": 18999,
         "served_model_name": "tiny", "health_timeout_s": 90})})
    inv2 = tmp_path / "hosts.yaml"
    inv2.write_text(fleet.inventory_yaml([prod, hosts["rent1"]]))
    pipe = tmp_path / "pipeline.yaml"
    pipe.write_text("target_model: /model\nprepare:\n  datasets: [regenerated/dataset.jsonl]\n  max_samples: 40\n"
                    "  max_seq_len: 64\n")
    wants = [r for r in _json_lines(_cli("weights", "rent1", "--from", "rent0", "-i", str(inv2), "--dry-run").stdout)
             if "send_bytes" in r][0]
    cli = _cli("cycle", "rent0", "--work", "rent1", "--run", "cyc", "--pipeline", str(pipe), "-i", str(inv2),
               "--dry-run", "--json")
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    plan = json.loads(cli.stdout[cli.stdout.index("{\n"):])
    steps = {s["key"]: s for s in plan["steps"]}
    assert steps["weights:rent1"]["send_bytes"] == wants["send_bytes"]
    assert steps["weights:rent1"]["expected_s"] == (0.0 if wants["send_bytes"] == 0 else wants["estimate_s"])
    assert steps["train"]["hosts"] == ["rent1"] and steps["acceptance"]["hosts"] == ["rent1"]
    assert plan["production_serving"]["restart_bound_s"] == 90.0
    assert [k for k, s in steps.items() if s["production_restarts_keep"]] == ["speculate"]
    for s in plan["steps"]:  # timed from what the hosts recorded over SSH, or said to have nothing recorded
        assert s["expected_s"] is not None or "no recorded figure" in " ".join(
            [s["note"], *(p["note"] for p in s["parts"])]), s
    assert [p["part"] for p in steps["speculate"]["parts"]] == ["head transfer", "the gate"]
    with Remote(prod) as r:
        assert not r.run(hc.exists(f"{prod.state_dir}/cycles"), check=False).ok


def test_cycle_steps_journaled_on_production_over_ssh_and_a_rerun_skips_them(rent, tmp_path, request):
    """``cycle rent0 --work rent1`` for real, up to the first step these hosts cannot do: regenerate answers on
    rent0's serving (the STAND-IN OpenAI server, NOT vLLM, as a ``process`` serving), the dataset is copied to rent1
    (sha256 checked), the weights are copied or found there, and extract fails (rent1 has no pipeline environment).
    The journal and lock are on rent0; the lock is given back; a rerun skips the three finished steps."""
    hosts, _, nodes = rent
    port = 18998
    # matched by this run's own model path: the nodes share this machine's process table
    match = f"standin_openai_server.py --port {port} .*--require-file {hosts['rent0'].model_path}/"
    prod = hosts["rent0"].model_copy(update={"serving": hosts["rent0"].serving.model_validate(
        {"kind": "process", "process_match": match, "port": port, "served_model_name": "tiny",
         "health_timeout_s": 90})})
    fleet.start_standin_server(prod, nodes[0], REPO / "tests/data/standin_openai_server.py", port=port, model="tiny",
                               extra=["--bind", "0.0.0.0",  # answers the driver at the node's address
                                      "--require-file", f"{prod.model_path}/config.json"])  # exits without it

    def stop_production() -> None:
        with Remote(prod) as r:
            for p in r.run(pc.find_process(match), check=False).stdout.split():
                r.run(["kill", p], check=False)

    request.addfinalizer(stop_production)
    inv2 = tmp_path / "hosts.yaml"
    inv2.write_text(fleet.inventory_yaml([prod, hosts["rent1"]]))
    pipe = tmp_path / "pipeline.yaml"
    pipe.write_text("target_model: /model\nprepare:\n  datasets: [regenerated/dataset.jsonl]\n  max_samples: 4\n")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i}"},
                                                                      {"role": "assistant", "content": "a"}]}) + "\n"
                             for i in range(3)))
    argv = [sys.executable, "-m", "eagle3ops", "cycle", "rent0", "--work", "rent1", "--run", "cyc", "--dataset",
            str(chats), "--pipeline", str(pipe), "-i", str(inv2)]

    def journal() -> list[dict]:
        with Remote(prod) as r:
            out = r.run(hc.cat_if_exists(f"{prod.state_dir}/cycles/cyc/journal.jsonl"), check=False).stdout
        return [json.loads(line) for line in out.splitlines()]

    first = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=tmp_path)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    err = " ".join(first.stderr.split())
    assert "step extract on rent1 failed" in err, first.stdout[-3000:] + first.stderr[-3000:]
    assert "finished steps are not repeated" in err
    events = [(e["step"], e["event"]) for e in journal()]
    # a command step's child is journaled twice: before it starts, then with its pid
    assert events == [("regenerate", "start"), ("regenerate", "child"), ("regenerate", "child"), ("regenerate", "done"),
                      ("dataset", "start"), ("dataset", "done"), ("weights:rent1", "start"), ("weights:rent1", "child"),
                      ("weights:rent1", "child"), ("weights:rent1", "done"), ("extract", "start"), ("extract", "child"),
                      ("extract", "child"), ("extract", "failed")]
    # each command ran as a child of the driver: its log and exit status on the driver's machine, named in the journal
    ex = [e for e in journal() if e["step"] == "extract" and e["event"] == "child"][-1]
    assert isinstance(ex["pid"], int) and Path(f"{ex['rc']}.pid").read_text().strip() == str(ex["pid"])
    assert Path(ex["rc"]).read_text().strip() == "1" and "no pipeline image deployed" in Path(ex["log"]).read_text()
    assert "no pipeline image deployed" in first.stdout  # and passed through
    copied = [e for e in journal() if e["step"] == "dataset" and e["event"] == "done"][0]
    rows = (tmp_path / "regenerated/rent0-cyc/dataset.jsonl").read_bytes()
    assert copied["dataset_sha256"] == hashlib.sha256(rows).hexdigest() and rows.count(b"\n") == 3
    assert _hashes(hosts["rent1"], f"{hosts['rent1'].data_dir}/runs/cyc/regenerated", ["dataset.jsonl"]) == {
        "dataset.jsonl": copied["dataset_sha256"]}
    with Remote(prod) as r:
        assert not r.run(hc.exists(f"{prod.state_dir}/cycles/cyc/lock"), check=False).ok  # given back

    again = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=tmp_path)
    assert again.returncode == 1
    for step in ("regenerate", "dataset", "weights:rent1"):
        assert f"[cycle] {step}: done in an earlier run" in again.stdout
    assert "every conversation answered already (resume log)" in again.stdout  # the plan reads regenerate's own
    assert [e["step"] for e in journal() if e["event"] == "start"] == [
        "regenerate", "dataset", "weights:rent1", "extract", "extract"]

    # the served acceptance for real on rent1: extract and train journaled done by a STAND-IN (these hosts have no
    # pipeline environment) and a STAND-IN head (a config.json) in rent1's run dir; production's floor above the
    # stand-in server's simulated 2.0 ends the cycle there, production's process never restarted
    from eagle3ops.commands import cycle as cyc
    from eagle3ops.speculate.cyclerun import CycleJournal

    work = hosts["rent1"]
    with Remote(prod) as r:
        pid = r.run(pc.find_process(match)).stdout.split()
        j = CycleJournal(r, f"{prod.state_dir}/cycles/cyc")
        for step in ("extract", "train"):
            j.record(step, "done", stand_in=True)
    with Remote(work) as r:
        r.run(hc.mkdir_p(f"{work.data_dir}/runs/cyc/train/final"))
        r.run(hc.write_file(f"{work.data_dir}/runs/cyc/train/final/config.json"), stdin="{}")
    high = prod.model_copy(update={"serving": prod.serving.model_copy(update={"acceptance_floor": 2.5})})
    inv2.write_text(fleet.inventory_yaml([high, work]))
    third = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=tmp_path)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    end = journal()[-1]
    assert (end["step"], end["event"]) == ("acceptance", "ended") and end["passed"] is False, end
    assert end["mean_acceptance_length"] == pytest.approx(2.0, abs=0.05) and end["source"].startswith("live process")
    assert f"{work.model_path}/config.json" in end["command"] and "--speculative-config" in end["command"]
    assert end["url"] == f"http://{work.hostname}:{port}" and end["stopped"].startswith("stopped: session")
    assert json.loads(third.stdout.splitlines()[-1])["production_restarts"] == 0
    with Remote(work) as r:  # nothing left on the work host
        assert r.run(pc.port_listeners(port)).stdout.strip() == ""
        sid = r.run(hc.cat(f"{work.state_dir}/cycles/cyc/serve/sid")).stdout.strip()
        assert not r.run(cyc.session_alive(f"{work.state_dir}/cycles/cyc/serve"), check=False).ok and sid
    with Remote(prod) as r:  # production's serving process is the one started before the cycle
        assert r.run(pc.find_process(match)).stdout.split() == pid
