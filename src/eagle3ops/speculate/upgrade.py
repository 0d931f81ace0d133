"""Before a release serves another vLLM than live serving: what a speed gate cannot show, read before any restart.

One entry point for both commands that release a serving image: ``release --gate --image``
(:func:`eagle3ops.speculate.gated.gated_release`) and ``speculate`` with a speculative image of another vLLM than
live serving's (:func:`speculate_checks`). Each check reads the images (throwaway containers, no network) and the live
container's spec; none changes anything:

- production's command line (with the release's flags set) parsed by the new image's own vLLM argument parser, and
  every removed, renamed or re-defaulted flag it uses from both images' parsers (:func:`upgrade_flags`,
  :func:`eagle3ops.images.vllmflags.upgrade_report`);
- whether the new vLLM starts in the live container's ``/dev/shm`` (:func:`eagle3ops.speculate.shmread.check_shm`);
- production's tokenizer as each image's own transformers reads it
  (:func:`eagle3ops.speculate.tokenread.check_tokenizer`).

Each refusal names the flag, the ``/dev/shm`` sizes or the tokenizer, says nothing was restarted and gives the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle3ops.config.plan import ReleaseChange
from eagle3ops.speculate.prechecks import SpeculateError

__all__ = ["live_vllm", "speculate_checks", "upgrade_checks", "upgrade_flags", "upgrade_tokenizer"]


def upgrade_flags(r: Any, change: ReleaseChange, echo: Callable[[str], None]) -> dict[str, Any] | None:
    """With a new image (``change.image``): production's command line parsed by the new image's own vLLM argument
    parser, and every removed, renamed or re-defaulted flag it uses, from both images' parsers
    (:func:`eagle3ops.images.vllmflags.upgrade_report`), printed before anything restarts. Read-only.

    Returns:
        the report as figures for the result (None: no image, no live serving container, or the same image);
        an image whose parser cannot be dumped (e.g. one without vLLM) gives ``{"not_compared": why}``.

    Raises:
        SpeculateError: the new image's parser refuses production's command line (the message quotes it, keys
            masked, and names the changed flags production uses).
    """
    from eagle3ops.images.vllmflags import FlagDumpError, upgrade_report

    if not change.image:
        return None
    try:
        rep = upgrade_report(r, change.image, change.args)
    except FlagDumpError as e:
        echo(f"note: vLLM flags not compared: {e}")
        return {"not_compared": str(e)}
    if rep is None:
        return None
    for line in rep.lines():
        echo(line)
    if rep.parse_ok is False:
        used = "; ".join(c.line() for c in rep.used) or "none of the flags it uses changed by name"
        raise SpeculateError(
            f"{r.host.name}: the vLLM {rep.new_vllm} parser of {change.image} refuses production's command line "
            f"({rep.parse_error}); flags it uses that changed since {rep.old_vllm}: {used}. Nothing was restarted: "
            f"give a renamed flag's new name with --arg; a removed flag has to leave serving's command line first")
    return rep.as_dict()


def upgrade_tokenizer(r: Any, change: ReleaseChange, echo: Callable[[str], None]) -> dict[str, Any] | None:
    """With a new image: whether its vLLM starts in the live container's ``/dev/shm``
    (:func:`eagle3ops.speculate.shmread.check_shm`) and production's tokenizer read by the live image's and the new
    image's own transformers (:func:`eagle3ops.speculate.tokenread.check_tokenizer`), before anything restarts.
    Read-only.

    Returns:
        the tokenizer comparison (with the ``/dev/shm`` reading under ``shm``) as figures for the result, or None
        (no image, no live container, the same image).

    Raises:
        SpeculateError: the new vLLM's shared-memory ring does not fit the container's ``/dev/shm`` (both sizes
            named), or the two images read the tokenizer differently (both classes and the first text named).
    """
    from eagle3ops.speculate.shmread import check_shm
    from eagle3ops.speculate.tokenread import check_tokenizer, live_spec

    try:
        shm = check_shm(r, change.image, live_spec(r, change.image))
        got = check_tokenizer(r, change.image, change.args)
    except ValueError as e:
        raise SpeculateError(str(e)) from None
    if shm is not None and "not_compared" in shm:
        echo(f"note: /dev/shm not compared: {shm['not_compared']}")
    if got is not None:
        echo(f"tokenizer {got['path']}: read alike by both images ({got['old']} / {got['new']})" if got.get("same")
             else f"note: tokenizer not compared: {got.get('not_compared')}")
    return None if got is None and shm is None else {**(got or {}), **({"shm": shm} if shm else {})}


def upgrade_checks(r: Any, change: ReleaseChange, echo: Callable[[str], None]) -> dict[str, Any]:
    """Every check of a release of ``change`` to another image, in order (:func:`upgrade_flags`, then
    :func:`upgrade_tokenizer`: ``/dev/shm`` and the tokenizer), before anything restarts. Read-only.

    Returns:
        figures for the result: ``vllm_flags`` and ``tokenizer`` for those that compared something (empty: no
        image, no live serving container, or the same image).

    Raises:
        SpeculateError: the first check that refuses (its message names the flag, ``/dev/shm`` or tokenizer, and
            the fix).
    """
    flags = upgrade_flags(r, change, echo)
    tokenizer = upgrade_tokenizer(r, change, echo)
    return {k: v for k, v in (("vllm_flags", flags), ("tokenizer", tokenizer)) if v is not None}


def _base(v: str | None) -> str | None:
    return v.split("+", 1)[0] if v else None


def live_vllm(r: Any) -> dict[str, Any]:
    """The vLLM live serving runs: ``{"vllm": version or None, "from": where it was read}``; read-only. The live
    container's image label (:func:`eagle3ops.speculate.crossread.image_vllm`), else live serving's ``/version``
    (:func:`eagle3ops.window.servedversion.served_version`)."""
    from eagle3ops.speculate.crossread import image_vllm
    from eagle3ops.speculate.prechecks import _live_image
    from eagle3ops.window.servedversion import served_version

    ref, image_id = _live_image(r)
    if ref or image_id:
        version, where = image_vllm(r, image_id or ref or "", ref)
        if version:
            return {"vllm": version, "from": f"live container's image {ref}: {where}"}
    version = served_version(r)
    return {"vllm": version, "from": "/version of the live server" if version else "not known"}


def speculate_checks(r: Any, change: ReleaseChange, vllm: str | None, echo: Callable[[str], None]
                     ) -> dict[str, Any]:
    """``speculate``'s share of :func:`upgrade_checks`: run them for the speculative release ``change`` (its image,
    production's flags with the ``--arg`` flags and ``--speculative-config`` set) when its vLLM (``vllm``: the
    serving image's labelled version, :func:`eagle3ops.speculate.ship.serving_vllm`) is not live serving's
    (:func:`live_vllm`), or either is not known; skipped for the same vLLM version (no throwaway containers). A
    process serves no image: nothing to check. Read-only; before anything is written on the host.

    Returns:
        figures for the result: ``cross_version`` (``{"speculative_vllm", "live_vllm", "checked"}``) and, when
        checked, :func:`upgrade_checks`'s; empty for a process.

    Raises:
        SpeculateError: a check refuses (:func:`upgrade_checks`).
    """
    if not change.image:
        return {}
    live = live_vllm(r)
    same = bool(vllm and live["vllm"] and _base(vllm) == _base(live["vllm"]))
    figures: dict[str, Any] = {"cross_version": {"speculative_vllm": vllm, "live_vllm": live, "checked": not same}}
    if same:
        return figures
    echo(f"the speculative image {change.image} serves vLLM {vllm or '(version not labelled)'}, live serving "
         f"{live['vllm'] or '(version not known)'}: its flags, /dev/shm and tokenizer are read before any restart")
    return {**figures, **upgrade_checks(r, change, echo)}
