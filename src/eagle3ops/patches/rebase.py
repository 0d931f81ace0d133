"""``eagle3ops patch rebase <pkg> --to <version>``: carry a series to a new upstream version.

For each patch of the source series, in order, on the pristine new wheel with the earlier kept patches applied:

* **applies** (forward zero-fuzz dry run succeeds, reverse does not): applied, and its diff regenerated against
  the new version (line numbers and context refreshed; header kept, ``X-Eagle3ops-Pin`` and ``Last-Update``
  updated);
* **already upstream** (its reverse applies on the new version): dropped, named in the report and in a ``series``
  comment;
* **fails**: the failed hunks (number + ``@@`` header) are reported; the original file is copied unchanged into the
  new dir but left out of ``series`` (commented), so ``patch check`` fails until someone ports it with
  ``patch new``/``refresh``.

The new series dir ``patches/<pkg>/<version>/`` gets ``upstream.yaml`` (kept if present, else written from the
downloaded wheel's sha256), the patches and ``series``.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eagle3ops.patches.apply import Action, apply_empty_files, decide
from eagle3ops.patches.diffgen import compose_patch, diff_trees, replace_header_fields
from eagle3ops.patches.errors import PatchToolError, SeriesError
from eagle3ops.patches.gnupatch import run_patch
from eagle3ops.patches.diffcheck import parse_diff, render
from eagle3ops.patches.installed import find_dist
from eagle3ops.patches.series import Series, Upstream, load_upstream, read_series_file
from eagle3ops.patches.wheels import discover_wheel, fetch_wheel, unpack_wheel


@dataclass
class RebaseEntry:
    """One patch's outcome: ``status`` is ``applies``, ``already-upstream`` or ``fails``; ``detail`` says more."""

    name: str
    status: str
    detail: str = ""


@dataclass
class RebaseReport:
    """What ``rebase`` did: the new series dir, its upstream record and one entry per source patch."""

    new_dir: Path
    upstream: Upstream
    upstream_written: bool
    entries: list[RebaseEntry] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no patch failed."""
        return all(e.status != "fails" for e in self.entries)


def write_upstream(path: Path, up: Upstream, note: str | None = None) -> None:
    """Write ``upstream.yaml`` (package, version, wheel, sha256[, index_url]) with an optional comment line."""
    data = {"package": up.package, "version": up.version, "wheel": up.wheel, "sha256": up.sha256}
    if up.index_url:
        data["index_url"] = up.index_url
    text = (f"# {note}\n" if note else "") + yaml.safe_dump(data, sort_keys=False)
    path.write_text(text, encoding="utf-8")


def _target_wheel(source: Series, to_version: str, new_dir: Path, cache: Path | None) -> tuple[Upstream, Path, bool]:
    """The new version's wheel: the one ``new_dir/upstream.yaml`` pins when it exists, else the one the index offers
    (its ``upstream.yaml`` written, with a note to compare the sha256 with the index's published digest). Returns
    ``(upstream, wheel path, whether upstream.yaml was written)``.

    Raises:
        WheelError: the wheel cannot be fetched, or its sha256 differs from the pinned one.
    """
    if (new_dir / "upstream.yaml").exists():
        up = load_upstream(new_dir / "upstream.yaml")
        return up, fetch_wheel(up, cache), False
    up = discover_wheel(source.package, to_version, cache, source.upstream.index_url)
    wheel = fetch_wheel(up, cache)
    write_upstream(
        new_dir / "upstream.yaml",
        up,
        note=f"sha256 computed from the wheel downloaded by eagle3ops patch rebase on {_dt.date.today()}; "
        "compare it with the index's published digest before committing",
    )
    return up, wheel, True


def rebase_series(source: Series, to_version: str, patches_dir: Path, *, cache: Path | None = None, force: bool = False) -> RebaseReport:
    """Rebase ``source`` onto ``to_version`` and write ``patches_dir/<pkg>/<to_version>/`` (see module docstring).

    Raises:
        SeriesError: the target dir already has a non-empty ``series`` (pass ``force`` to overwrite).
        WheelError: the new wheel cannot be fetched or its sha256 differs from an existing ``upstream.yaml``.
    """
    new_dir = patches_dir / source.package / to_version
    series_file = new_dir / "series"
    if series_file.exists() and read_series_file(series_file) and not force:
        raise SeriesError(f"{series_file} already lists patches", fix="remove the dir or pass --force to overwrite it")
    new_dir.mkdir(parents=True, exist_ok=True)
    up, wheel, written = _target_wheel(source, to_version, new_dir, cache)
    report = RebaseReport(new_dir=new_dir, upstream=up, upstream_written=written)
    today = _dt.date.today().isoformat()
    kept: list[str] = []
    comments: list[str] = [f"# rebased from {source.package} {source.version} by eagle3ops patch rebase on {today}"]
    with tempfile.TemporaryDirectory(prefix="eagle3ops-rebase-") as tmp:
        site = unpack_wheel(wheel, Path(tmp) / "site")
        dist = find_dist(source.package, site)
        label = f"{dist.name} {dist.version} (pristine wheel)"
        for patch in source.patches:
            try:
                action, files, _fwd = decide(patch, site, dist.top_levels, label)
            except PatchToolError as e:
                report.entries.append(RebaseEntry(patch.name, "fails", str(e).splitlines()[0]))
                shutil.copy2(patch.path, new_dir / patch.name)
                comments.append(f"# FAILED to rebase (port it with eagle3ops patch new/refresh): {patch.name}")
                continue
            if action is Action.ALREADY_APPLIED:
                report.entries.append(RebaseEntry(patch.name, "already-upstream", "its reverse applies: dropped"))
                comments.append(f"# dropped, already upstream in {to_version}: {patch.name}")
                continue
            before = Path(tmp) / "before" / patch.name
            for f in files:
                src = site / f.path
                if src.is_file():
                    (before / f.path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, before / f.path)
            if render(files):
                run = run_patch(render(files), site, dry_run=False)
                if not run.ok:  # dry run said it applies; anything else is an environment problem
                    raise PatchToolError(f"GNU patch failed after a clean dry run on {patch.name}: {run.output.strip()}")
            apply_empty_files(files, site)
            diff = diff_trees(before, site, dist.top_levels, only={f.path for f in files})
            parse_diff(diff, where=f"regenerated {patch.name}")  # sanity: still a valid, safe diff
            header = replace_header_fields(
                patch.header_text, {"X-Eagle3ops-Pin": f"{source.package}=={to_version}", "Last-Update": today}
            )
            (new_dir / patch.name).write_text(compose_patch(header, diff), encoding="utf-8")
            kept.append(patch.name)
            off = "; ".join(f"{f} hunk #{n} offset {o:+d}" for f, lst in _fwd.offsets.items() for n, o in lst)
            report.entries.append(RebaseEntry(patch.name, "applies", "diff refreshed" + (f" ({off})" if off else "")))
    series_file.write_text("\n".join(comments + kept) + "\n", encoding="utf-8")
    return report
