"""Read an image's Python environment into the page cache before its containers start (development harness).

Why: on this machine kind the disk answers a 4 KiB read in ~0.6 ms at queue depth 1 (~1,600 reads/s), while
parallel whole-file reads run at ~500 MB/s. Starting vLLM touches thousands of files and pages of ~1 GB shared
libraries in random order, so a cold page cache, not the CPU, decides how long the tests' vLLM starts take:
importing torch + vLLM in the local vLLM base took **82 s cold and 12 s warm** (measured here, AMD EPYC, 2 cores).
Reading the image's ``/opt/venv`` (8 GB, ~49k files) first, with several readers, takes ~20 s. Every Docker engine
keeps its own copy of the layers (the build engine, the sandbox's engine), so each copy is read where it is used:
the session fixture that starts the sandbox's serving (``tests/conftest.py``), ``scripts/test-image.sh`` before
the in-image suite, and the demo.

Not part of the eagle3ops wheel: production hosts keep their own page cache warm by serving.
"""

from __future__ import annotations

import os
import subprocess
import time

#: The image paths read by default: the local vLLM base keeps torch, vLLM and their libraries in this venv.
DEFAULT_PATHS = ("/opt/venv",)
#: Parallel readers (queue depth): whole-file reads, so each reader streams one file at a time.
READERS = 8
#: Bound on one warm-up (seconds); 8 GB at the measured rate takes ~20 s.
TIMEOUT_S = 300

# Reads every regular file under the paths given as arguments and prints the bytes read (wc counts what cat read).
_SCRIPT = ('find "$@" -xdev -type f -print0 | xargs -0 -r -P "$E3_READERS" -n 64 cat | wc -c')


class WarmError(RuntimeError):
    """The warm-up container failed (image missing, engine unreachable, a path absent from the image)."""


def warm_argv(image: str, paths: tuple[str, ...] = DEFAULT_PATHS, readers: int = READERS,
              name: str | None = None) -> list[str]:
    """The ``docker run`` argv that reads ``paths`` of ``image`` (its layers on the engine that runs it) and prints
    the bytes read. No network, removed when done, named ``name`` when given (so a timed-out run can be removed);
    the image's entrypoint is replaced by ``sh``."""
    return ["docker", "run", "--rm", "--network", "none", *(["--name", name] if name else []),
            "-e", f"E3_READERS={int(readers)}", "--entrypoint", "sh", image, "-c", _SCRIPT, "warm", *paths]


def warm(image: str, docker_host: str | None = None, paths: tuple[str, ...] = DEFAULT_PATHS,
         readers: int = READERS, timeout: float = TIMEOUT_S) -> tuple[int, float]:
    """Read ``paths`` of ``image`` on the engine at ``docker_host`` (``unix://...``; ``None``: the default engine)
    into the page cache.

    Returns:
        (bytes read, seconds taken).

    Raises:
        WarmError: the container failed (its stderr is in the message), read nothing, or ran past ``timeout``
            seconds (it is then removed: a disk busy with other work can make the warm-up slower than it saves).
    """
    import uuid

    env = dict(os.environ)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    name = f"e3-warm-{uuid.uuid4().hex[:10]}"
    t0 = time.monotonic()
    try:
        p = subprocess.run(warm_argv(image, paths, readers, name), capture_output=True, text=True, env=env,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, env=env, timeout=60)
        raise WarmError(f"warming {', '.join(paths)} of {image} on {docker_host or 'the default engine'} took more "
                        f"than {timeout:.0f} s (the disk is busy): stopped") from None
    dt = time.monotonic() - t0
    out = p.stdout.strip().splitlines()
    if p.returncode != 0 or not out or not out[-1].isdigit() or int(out[-1]) == 0:
        raise WarmError(f"warming {', '.join(paths)} of {image} on {docker_host or 'the default engine'} failed "
                        f"(exit {p.returncode}): {p.stderr.strip()[-600:] or p.stdout.strip()[-600:]}")
    return int(out[-1]), dt


def warm_quietly(image: str, docker_host: str | None = None, *, label: str,
                 timeout: float = TIMEOUT_S) -> None:
    """:func:`warm`, printing what it read (``[label] ...``), or why it could not: the warm-up only saves time, so
    a failure is printed and never raised (the containers then start from a cold cache, slower)."""
    try:
        n, dt = warm(image, docker_host, timeout=timeout)
    except WarmError as exc:
        print(f"[{label}] page cache not warmed: {exc}", flush=True)
        return
    print(f"[{label}] page cache: read {n / 1e9:.2f} GB of {image} on {docker_host or 'the build engine'} "
          f"in {dt:.0f} s", flush=True)
