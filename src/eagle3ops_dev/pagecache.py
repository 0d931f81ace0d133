"""Read the large files of an image's Python environment before its containers start (development harness).

Why: on this machine kind a block read for the first time is slow (the virtual disk fetches it; later reads are
fast even after the guest drops its page cache), and starting vLLM page-faults through ~1.2 GB of ~100 shared
libraries in random order. Measured here (AMD EPYC, 2 cores, 2026-12-02, the local vLLM base): the import of torch +
vLLM + its OpenAI server took **160 s cold**; reading the 348 files of ``/opt/venv`` over 256 KiB (7.9 GB) with 8
parallel readers took 98 s, and the same import after it **10 s**. Small files (49k, 0.55 GB) are left to the
imports. Every Docker engine keeps its own copy of the layers (the build engine, the sandbox's engine), so each copy
is read where it is used: the session fixtures that build the pipeline image and start the sandbox's serving
(``tests/conftest.py``) and ``scripts/test-image.sh`` before the in-image suite. On a cold disk two streams warming
at once made both slower (the host suite's two parts side by side, 2026-12-02); ``make test`` runs the host suite
beside the in-image suite, whose read of the build engine's copy comes first and takes seconds when warm.

Not part of the eagle3ops wheel: production hosts keep their libraries warm by serving.
"""

from __future__ import annotations

import os
import subprocess
import time

#: The image paths read by default: the local vLLM base keeps torch, vLLM and their libraries in this venv.
DEFAULT_PATHS = ("/opt/venv",)
#: Parallel readers (queue depth): whole-file reads, so each reader streams one file at a time.
READERS = 8
#: Only files larger than this are read (KiB): the shared libraries hold 93 % of the bytes in 0.7 % of the files.
MIN_KIB = 256
#: Bound on one warm-up (seconds); 7.9 GB from a cold disk took 98 s.
TIMEOUT_S = 300

# Reads every regular file over $E3_MIN_KIB KiB under the paths given as arguments and prints the bytes read (wc
# counts what cat read).
_SCRIPT = ('find "$@" -xdev -type f -size +"$E3_MIN_KIB"k -print0 | xargs -0 -r -P "$E3_READERS" -n 4 cat | wc -c')


class WarmError(RuntimeError):
    """The warm-up container failed (image missing, engine unreachable, a path absent from the image)."""


def warm_argv(image: str, paths: tuple[str, ...] = DEFAULT_PATHS, readers: int = READERS,
              name: str | None = None, min_kib: int = MIN_KIB) -> list[str]:
    """The ``docker run`` argv that reads the files over ``min_kib`` KiB under ``paths`` of ``image`` (its layers on
    the engine that runs it) and prints the bytes read. No network, removed when done, named ``name`` when given (so a timed-out run can be removed);
    the image's entrypoint is replaced by ``sh``."""
    return ["docker", "run", "--rm", "--network", "none", *(["--name", name] if name else []),
            "-e", f"E3_READERS={int(readers)}", "-e", f"E3_MIN_KIB={int(min_kib)}", "--entrypoint", "sh", image,
            "-c", _SCRIPT, "warm", *paths]


def warm(image: str, docker_host: str | None = None, paths: tuple[str, ...] = DEFAULT_PATHS,
         readers: int = READERS, timeout: float = TIMEOUT_S, min_kib: int = MIN_KIB) -> tuple[int, float]:
    """Read the files over ``min_kib`` KiB under ``paths`` of ``image`` on the engine at ``docker_host``
    (``unix://...``; ``None``: the default engine), so that their blocks are in the page cache.

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
        p = subprocess.run(warm_argv(image, paths, readers, name, min_kib), capture_output=True, text=True, env=env,
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
