"""The speculators series' behavioural probes, run against the installed (patched) speculators and vLLM.

Runs inside the pipeline image (or, for development, /opt/e3/venv-ml with a patched speculators first on
PYTHONPATH). Every probe starts from tiny models built locally by :mod:`eagle3ops.fixtures.tinymodel`; the probes share
two vLLM engines (tiny Llama with a remote-code tokenizer, tiny DeepSeek-V3) for the module.

The negative tests take the installed speculators, reverse-apply patches of the checked-in series with
``patch -R --fuzz=0`` into a scratch copy and show that the matching probe then fails (in a subprocess, with the
scratch copy first on ``sys.path``): the probes detect the faults the patches fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eagle3ops.patches import probekit, probes
from eagle3ops.fixtures.tinymodel import build_tiny_model

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches" / "speculators"


@pytest.fixture(scope="module", autouse=True)
def _shared_engines():
    yield
    probes.shutdown()


def _installed_series() -> Path:
    """Series dir matching the installed speculators version (fails if the repo's patches/ is missing)."""
    import speculators

    version = speculators.__version__ if hasattr(speculators, "__version__") else None
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("speculators")
    d = PATCHES / version.split("+")[0]
    assert (d / "series").is_file(), f"{d}/series missing: run the tests from a checkout that has patches/"
    return d


def _series_names(d: Path) -> list[str]:
    return [ln.strip() for ln in (d / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_every_series_probe_is_registered():
    names = set()
    for patch in sorted(PATCHES.glob("*/*.patch")):
        m = re.search(r"^X-Eagle3ops-Probe:\s*(\S+)\s*$", patch.read_text(), re.MULTILINE)
        assert m, f"{patch}: no X-Eagle3ops-Probe field"
        names.add(m.group(1))
    assert names, "no patches found"
    assert names <= set(probes.PROBES), f"probes missing from PROBES: {sorted(names - set(probes.PROBES))}"


def _probes_of(series_root: Path) -> list[str]:
    """The X-Eagle3ops-Probe names of every patch under ``series_root``."""
    out = set()
    for patch in sorted(series_root.glob("*/*.patch")):
        m = re.search(r"^X-Eagle3ops-Probe:\s*(\S+)\s*$", patch.read_text(), re.MULTILINE)
        if m:
            out.add(m.group(1))
    return sorted(out)


#: The probes of the series this pipeline image applies (speculators'). The vLLM serving series' probes
#: (eagle3-greedy-identity-*) need that series applied to the installed vLLM: they run where it is, through
#: `eagle3ops patch probe --profile vllm-0.16.0-serving-cpu-standin` on the stand-in base (patches/README.md).
SPECULATORS_PROBES = _probes_of(PATCHES)


@pytest.mark.parametrize("name", SPECULATORS_PROBES)
def test_probe_passes_on_installed_patched_package(name):
    probes.PROBES[name]()  # raises ProbeFailed naming the wrong behaviour
    assert name in probes.LAST_RUN
    print(name, json.dumps({k: (v if not hasattr(v, "__dict__") else vars(v)) for k, v in probes.LAST_RUN[name].items()}))


def test_tiny_model_kinds(tmp_path):
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    llama = build_tiny_model(tmp_path / "llama", kind="llama")
    tok = AutoTokenizer.from_pretrained(llama)
    assert isinstance(tok, PreTrainedTokenizerFast)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|bos|><|user|>\nhi<|eos|>\n<|assistant|>\n"
    assert max(tok.get_vocab().values()) < 2048
    cfg = AutoConfig.from_pretrained(llama)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (128, 4, 4, 2)

    remote = build_tiny_model(tmp_path / "remote", kind="llama-remote-code")
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(remote)
    rtok = AutoTokenizer.from_pretrained(remote, trust_remote_code=True)
    assert type(rtok).__name__ == "TinyTokenizer" and not rtok.is_fast
    assert rtok.decode(rtok("héllo", add_special_tokens=False)["input_ids"]) == "héllo"
    # same seed, same weights as the plain llama
    assert (remote / "model.safetensors").read_bytes() == (llama / "model.safetensors").read_bytes()

    ds = AutoConfig.from_pretrained(build_tiny_model(tmp_path / "ds", kind="deepseek-v3"))
    assert ds.model_type == "deepseek_v3" and ds.qk_nope_head_dim + ds.qk_rope_head_dim == 64
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path / "ds", kind="deepseek-v3")



def test_probe_fixtures_and_their_reference_are_built_once_per_content_hash(tmp_path, monkeypatch):
    """With a fixture cache, the tiny DeepSeek-V3 is built once and reused (the same entry, no build), and so is
    its transformers reference forward: the reused tensors equal the computed ones. Another set of sequences is
    another key (computed). Without a cache nothing is kept."""
    import torch

    from eagle3ops.patches import fixtures

    cache = tmp_path / "cache"
    seqs = probekit._random_sequences(3, 8, 24, seed=7)
    target = fixtures.target("deepseek-v3", tmp_path / "scratch", cache=cache)
    assert fixtures.LAST_SOURCE["deepseek-v3"] == "built"
    assert fixtures.target("deepseek-v3", tmp_path / "scratch", cache=cache) == target
    assert fixtures.LAST_SOURCE["deepseek-v3"] == "reused"
    first = probekit.reference_layer_states(target, seqs, probekit.DEEPSEEK_LAYERS)
    assert probekit.LAST_REFERENCE_SOURCE["decoder-layer-outputs"] == "computed"
    again = probekit.reference_layer_states(target, seqs, probekit.DEEPSEEK_LAYERS)
    assert probekit.LAST_REFERENCE_SOURCE["decoder-layer-outputs"] == "reused"
    assert all(torch.equal(a, b) for ra, rb in zip(first, again) for a, b in zip(ra, rb))
    probekit.reference_layer_states(target, seqs[:2], probekit.DEEPSEEK_LAYERS)
    assert probekit.LAST_REFERENCE_SOURCE["decoder-layer-outputs"] == "computed"
    assert len(list((cache / "references").glob("*.pt"))) == 2
    monkeypatch.delenv(fixtures.CACHE_ENV, raising=False)
    assert fixtures.target("deepseek-v3", tmp_path / "plain") == tmp_path / "plain" / "deepseek-v3"
    assert fixtures.LAST_SOURCE["deepseek-v3"] == "scratch"


def test_the_image_carries_the_probes_fixtures_and_not_the_harness():
    """The image's own interpreter (``python3 -I``: no PYTHONPATH -- this suite mounts the harness there for the
    trained sandbox target's test --, no working directory on the path) loads the probes' fixtures from the installed
    eagle3ops, remote-code package data included, and cannot import the development harness ``eagle3ops_dev``."""
    code = ("import importlib.util as u, eagle3ops.fixtures.tinykimi as k, eagle3ops.patches.fixtures as s; "
            "print(s.load().__file__); print(len(k.PAT_STR) > 0); print(u.find_spec('eagle3ops_dev'))")
    cp = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert cp.returncode == 0, cp.stderr[-2000:]
    fixtures_file, pat_str, harness = cp.stdout.split()
    assert fixtures_file.endswith("-packages/eagle3ops/fixtures/__init__.py"), fixtures_file  # installed, no checkout
    assert (pat_str, harness) == ("True", "None")
    cp = subprocess.run([sys.executable, "-I", "-c", "import eagle3ops_dev"], capture_output=True, text=True,
                        timeout=120, cwd="/")
    assert cp.returncode != 0 and "No module named 'eagle3ops_dev'" in cp.stderr, (cp.returncode, cp.stderr[-2000:])


# ----------------------------------------------------------------------------------- probes catch the faults

_RUNNER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    if __name__ == "__main__":
        from eagle3ops.patches import probes
        # as ``patch probe`` does: the workers' forkserver starts (and imports the tree under test) first
        assert probes.warm([sys.argv[2]])
        import speculators
        assert speculators.__file__.startswith(sys.argv[1]), speculators.__file__
        from eagle3ops.patches import probes
        try:
            probes.PROBES[sys.argv[2]]()
        except probes.ProbeFailed as e:
            print("PROBE-FAILED:", sys.argv[2], "--", e)
            probes.shutdown()
            sys.exit(3)
        probes.shutdown()
        print("PROBE-PASSED")
    """
)


def _probe_of(patch: Path) -> str:
    m = re.search(r"^X-Eagle3ops-Probe:\s*(\S+)\s*$", patch.read_text(), re.MULTILINE)
    assert m, patch
    return m.group(1)


def _tree_without(tmp_path: Path, probe: str) -> Path:
    """Copy the installed speculators and reverse-apply (strictly) the patch whose probe is ``probe``.

    If that patch alone does not reverse (a later patch edits its context), it is reversed together with every
    later patch of the series, last first.
    """
    import speculators

    series = _installed_series()
    names = _series_names(series)
    idx = [i for i, n in enumerate(names) if _probe_of(series / n) == probe]
    assert idx, f"no patch with probe {probe} in {series}"
    src = Path(speculators.__file__).parent
    for drop in ([names[idx[0]]], names[idx[0]:]):
        root = tmp_path / f"site-{len(drop)}"
        shutil.copytree(src, root / "speculators", ignore=shutil.ignore_patterns("__pycache__"))
        for name in reversed(drop):
            r = subprocess.run(
                ["patch", "-p1", "-R", "--fuzz=0", "--no-backup-if-mismatch", "-d", str(root), "-i", str(series / name)],
                check=False, capture_output=True, text=True,
            )
            if r.returncode != 0:
                break
        else:
            return root
    raise AssertionError(f"cannot reverse {names[idx[0]]} from the installed package (not patched with {series}?)")


def _run_probe_in(tree: Path, probe: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "run_probe.py"
    script.write_text(_RUNNER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(script), str(tree), probe], check=False, capture_output=True, text=True, env=env, timeout=600)


def test_tokenizer_probe_fails_without_tokenizer_patch(tmp_path):
    r = _run_probe_in(_tree_without(tmp_path, "tokenizer-remote-code"), "tokenizer-remote-code", tmp_path)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    assert "PROBE-FAILED: tokenizer-remote-code" in r.stdout and "trust_remote_code" in r.stdout


def test_attribution_probe_fails_without_attribution_patch(tmp_path):
    r = _run_probe_in(_tree_without(tmp_path, "prefill-attribution"), "prefill-attribution", tmp_path)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    # 0.3.0: truncated / misattributed states; 0.4.0.1: more than 32 sequences fail outright.
    assert "PROBE-FAILED: prefill-attribution" in r.stdout


def test_deepseek_probe_fails_without_deepseek_patch(tmp_path):
    r = _run_probe_in(_tree_without(tmp_path, "deepseek-capture"), "deepseek-capture", tmp_path)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    # 0.3.0: refused (no SupportsEagle3); 0.4.0.1: accepted, but states drift (CPU rotary kernel on q_pe).
    assert "PROBE-FAILED: deepseek-capture" in r.stdout


def test_kimi_probe_fails_without_kimi_patch(tmp_path):
    r = _run_probe_in(_tree_without(tmp_path, "kimi-k25-targets"), "kimi-k25-targets", tmp_path)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    # Without the patch the generator leaves the vision modality on (and, on 0.3.0, the draft head cannot read
    # the remote-code verifier config nor find its tensors under language_model.).
    assert "PROBE-FAILED: kimi-k25-targets" in r.stdout


# ----------------------------------------------------------------------------- engines for patch probe


def test_prepare_starts_engines_concurrently_and_finish_kills_their_workers(monkeypatch):
    """``eagle3ops patch probe`` calls warm(names), prepare(names) then finish(): both engines start
    (concurrently), their workers forked from the forkserver warm started (not children of this process) with this
    process's environment of when they started, vLLM's own start method back once they are up; the probes pass on
    them, and finish() leaves no worker process alive."""
    from vllm.v1.executor import multiproc_executor

    probes.shutdown()  # start from no engines (earlier tests share them)
    vllm_context = multiproc_executor.get_mp_context
    assert probes.warm(["prefill-attribution", "deepseek-capture", "no-such-probe"])
    monkeypatch.setenv("E3_TEST_SET_AFTER_WARM", "seen by the workers")
    started = probes.prepare(["prefill-attribution", "deepseek-capture", "no-such-probe"])
    assert set(started) == {"llama-remote-code", "deepseek-v3"} == set(probekit._ENGINES)
    assert os.environ.get("VLLM_SLEEP_WHEN_IDLE") == "1" and os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
    assert multiproc_executor.get_mp_context is vllm_context
    probes.PROBES["cpu-device"]()
    probes.PROBES["deepseek-capture"]()
    procs = [w.proc for e in probekit._ENGINES.values() for w in e.generator.executor.workers]
    assert procs and all(p.is_alive() for p in procs)
    for pid in (p.pid for p in procs):
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid != os.getpid(), f"worker {pid} was started by this process, not by the forkserver"
    for eng in probekit._ENGINES.values():
        seen = eng.generator.executor.collective_rpc(lambda _worker: (os.environ.get("E3_TEST_SET_AFTER_WARM"),
                                                                      os.environ.get("VLLM_MLA_DISABLE")))
        assert seen == [("seen by the workers", "1")], seen
    probes.finish()
    assert not probekit._ENGINES and not any(p.is_alive() for p in procs)
    assert probes.prepare([]) == {}
