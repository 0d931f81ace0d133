"""The host's stack profile against the live server: a window does not start when serving's ``/version`` is not the
vLLM version of the profile the host is set to (``hosts.<h>.profile``, default: the registry's default profile).

Why: the profile decides the pipeline image (speculators, the vLLM the stages and probes mirror, how a head is
written); a host whose serving was upgraded (``release --gate --image``) or rolled back under it would train heads
for, and judge them on, another vLLM than the one serving them. The fix is one line in the inventory (or a
rollback), so the refusal names both versions and the key.

``/version`` is vLLM's own route (``{"version": "0.16.0+cpu"}``); PEP 440's rule for ``==`` without a local label
applies (``0.16.0+cpu`` is vLLM 0.16.0), as for the patch pins (:mod:`eagle3ops.patches.series`). A server that
does not answer it (a stand-in, an older build) is not judged: the check says so and passes.
"""

from __future__ import annotations

from typing import Any

from eagle3ops.serving_http import VERSION
from eagle3ops.window.loopback import read_json

KEY = "profile"


def profile_vllm(h: Any) -> tuple[str, str | None]:
    """``(profile name, its vLLM pin or None)`` for host ``h``: ``hosts.<h>.profile`` or the registry's default.

    Raises:
        ValueError: the registry (patches/profiles.yaml) cannot be found or read, or names no such profile; the
            message names ``hosts.<h>.profile`` and the known profiles.
    """
    from eagle3ops.config.base import ConfigError
    from eagle3ops.config.profiles import load_registry
    from eagle3ops.patches.errors import PatchToolError
    from eagle3ops.patches.series import find_patches_dir

    where = f"hosts.{h.name}.{KEY}"
    try:
        reg = load_registry(find_patches_dir(None))
        name, entry = reg.entry(h.profile, where=where)
    except (ConfigError, PatchToolError) as e:
        raise ValueError(str(e)) from None
    return name, entry.pins().get("vllm")


def version_refusal(host: str, profile: str, pin: str | None, served: str | None) -> str | None:
    """The refusal when vLLM ``served`` (``/version``'s) is not the profile's ``pin``, else None (pure). The local
    label is ignored (``0.32.0+cpu`` is 0.32.0); no pin or no answer: nothing to judge."""
    if not pin or not served:
        return None
    if served.split("+", 1)[0] == pin.split("+", 1)[0]:
        return None
    return (f"live serving on {host} reports vLLM {served} (/version) but hosts.{host}.{KEY} is {profile} "
            f"(vLLM {pin}): set hosts.{host}.{KEY} to a profile of vLLM {served.split('+', 1)[0]} "
            f"(docs/vllm-profiles.md), or roll serving back (`eagle3ops rollback {host}`)")


def served_version(r: Any) -> str | None:
    """``GET /version``'s ``version`` of serving on the host's loopback (:func:`eagle3ops.window.loopback.read_json`:
    read-only, one try of 5 s); None when it does not answer with one."""
    out = read_json(r, VERSION)
    v = out.get("version") if isinstance(out, dict) else None
    return v if isinstance(v, str) and v else None


def check_served_version(r: Any, pf: Any) -> None:
    """Add the ``serving vLLM version`` check to preflight ``pf``: the live server's ``/version`` against the host's
    profile (:func:`version_refusal`); a profile set but unknown (or no registry found for it: set
    ``$EAGLE3OPS_PATCHES_DIR``) fails it too. Without a profile and without a registry it is not judged."""
    h = r.host
    try:
        profile, pin = profile_vllm(h)
    except ValueError as e:
        # no profile set and no registry at hand (a driver installed without the repository's patches/): the
        # default cannot be named, so it is not judged; a profile that was set must be found
        pf.add("serving vLLM version", h.profile is None, ("not judged: " if h.profile is None else "")
               + str(e).splitlines()[0])
        return
    served = served_version(r)
    refusal = version_refusal(h.name, profile, pin, served)
    if refusal:
        pf.add("serving vLLM version", False, refusal)
    elif served is None:
        pf.add("serving vLLM version", True, f"not judged: serving did not answer /version (profile {profile})")
    else:
        pf.add("serving vLLM version", True, f"{served}, as profile {profile} (vLLM {pin})")
