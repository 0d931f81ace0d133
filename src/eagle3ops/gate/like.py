"""Like for like: what each release the gate measured runs, and whether two of them may be compared.

vLLM builds differ in speed on their own (vllm #33497, #40551): a throughput ratio between a baseline on one image
and a speculative release on another mixes the image's own speed with speculation's. So every measured release's
identity is recorded (:class:`ReleaseIdentity`: image reference and id, the image's ``io.eagle3ops.*`` labels
(profile, patch series), the full argv, vLLM's ``/version``), and a decision across unlike releases is refused
(:func:`unlike`) unless the baseline is a **control release**: the speculative image without
``--speculative-config``, every other flag equal (:func:`control_change`), measured in the same job.

Pure: no I/O. Imports nothing of eagle3ops but the redaction rule (:mod:`eagle3ops.redact`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eagle3ops import redact

__all__ = ["LABEL_PREFIX", "SPECULATIVE_FLAG", "ReleaseIdentity", "control_change", "flag_names", "unlike",
           "without_flags"]

#: Image labels kept in an identity: the profile, patch series and stand-in marks eagle3ops writes
#: (:mod:`eagle3ops.images.tags`).
LABEL_PREFIX = "io.eagle3ops."
#: The one flag a control release leaves out.
SPECULATIVE_FLAG = "--speculative-config"


@dataclass(frozen=True)
class ReleaseIdentity:
    """What one measured release runs.

    Attributes:
        image: the image reference the serving container names (None: a process or unit, no image).
        image_id: the image's content id (``sha256:...``), None when unknown or no image.
        labels: the image's labels starting with :data:`LABEL_PREFIX` (profile, patches), ``{}`` without an image.
        argv: the server's whole command line (a container: ``Entrypoint`` + ``Cmd``; a process: its argv).
        vllm_version: ``GET /version``'s ``version``, None when the server did not answer it.
    """

    image: str | None = None
    image_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    vllm_version: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ReleaseIdentity":
        """From :meth:`figures` (or a partial dict: missing keys are unknown)."""
        d = d or {}
        return cls(image=d.get("image"), image_id=d.get("image_id"),
                   labels={str(k): str(v) for k, v in (d.get("labels") or {}).items()},
                   argv=[str(a) for a in d.get("argv") or []], vllm_version=d.get("vllm_version"))

    def figures(self) -> dict[str, Any]:
        """JSON-ready, for the result and the audit line; the argv with its secrets masked
        (:func:`eagle3ops.redact.argv`)."""
        return {**asdict(self), "argv": redact.argv(self.argv)}

    def describe(self) -> str:
        """``IMAGE (id sha256:0123456789ab, vLLM 0.16.0)`` in one line."""
        what = self.image or "no image (a process)"
        bits = [f"id {self.image_id[:19]}" if self.image_id else "id unknown"] if self.image else []
        bits.append(f"vLLM {self.vllm_version or 'version unknown'}")
        return f"{what} ({', '.join(bits)})"


def flag_names(args: Iterable[str]) -> set[str]:
    """The ``--flag`` names in ``args`` (``--a=b`` counts as ``--a``)."""
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def without_flags(argv: Sequence[str], flags: Iterable[str]) -> list[str]:
    """``argv`` without each of ``flags`` and its value (``--f VALUE`` or ``--f=VALUE``); a flag followed by
    another ``--flag`` or by nothing is dropped alone."""
    drop, out, i = set(flags), [], 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if name in drop:
            i += 1 if "=" in a or i + 1 >= len(argv) or argv[i + 1].startswith("--") else 2
            continue
        out.append(a)
        i += 1
    return out


def control_change(speculative_args: Sequence[str]) -> list[str]:
    """The control release's arguments: the speculative change's without :data:`SPECULATIVE_FLAG` (on a CPU host
    e.g. ``--override-generation-config`` stays, so control and speculative differ by that one flag)."""
    return without_flags(speculative_args, [SPECULATIVE_FLAG])


def unlike(baseline: ReleaseIdentity, speculative: ReleaseIdentity, *, change_flags: Iterable[str]) -> str | None:
    """Why ``baseline`` and ``speculative`` may not be compared, in one line; None when they are like for like.

    Like for like: the same image (by id when both ids are known, else by reference), the same vLLM version when
    both answered ``/version``, and the same argv once the flags the speculative change sets (``change_flags``,
    e.g. ``--speculative-config``) are taken out of both.
    """
    why = []
    if baseline.image or speculative.image:
        same = (baseline.image_id == speculative.image_id if baseline.image_id and speculative.image_id
                else baseline.image == speculative.image)
        if not same:
            why.append(f"images differ: baseline {baseline.describe()}, speculative {speculative.describe()}")
    if baseline.vllm_version and speculative.vllm_version and baseline.vllm_version != speculative.vllm_version:
        why.append(f"vLLM versions differ: baseline {baseline.vllm_version}, speculative {speculative.vllm_version}")
    flags = set(change_flags)
    b, s = without_flags(baseline.argv, flags), without_flags(speculative.argv, flags)
    if baseline.argv and speculative.argv and b != s:
        only_b = [a for a in b if a not in s]
        only_s = [a for a in s if a not in b]
        why.append(f"command lines differ beyond {', '.join(sorted(flags)) or 'nothing'}: baseline only "
                   f"{only_b or '(order)'}, speculative only {only_s or '(order)'}")
    return "; ".join(why) or None
