"""The head on the host, for ``speculate``: a local head uploaded (or one from another host fetched) into
``<data_dir>/heads/``, the dry run's head check (what it can check without changing anything) and the inspect helper's
answer (:mod:`eagle3ops.speculate.onhost` in the pipeline image on the host). :mod:`eagle3ops.speculate.ship` runs
them under the host's lock (the dry run's check aside: reads only)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3ops.commands import host as hc
from eagle3ops.commands import speculate as sc
from eagle3ops.speculate import prompts as pr
from eagle3ops.speculate.headcheck import HeadFacts, HeadMismatch, check_head
from eagle3ops.speculate.onhost import head_sha256, parse_answer, safetensors_shapes
from eagle3ops.speculate.prechecks import SpeculateError, SpeculateOptions
from eagle3ops.transfer.weights import InstalledHead

__all__ = ["ESTIMATE_MAX_TOKENS", "INSPECT_TIMEOUT_S", "dry_run_head", "dry_run_head_check", "inspect_on_host",
           "upload_head"]

#: Bound on the inspect helper (pipeline image start + reading headers and chats), seconds.
INSPECT_TIMEOUT_S = 300.0
#: Held-out tokens the host's estimate of a head from elsewhere reads (:mod:`eagle3ops.stages.estimate`).
ESTIMATE_MAX_TOKENS = 8192



def upload_head(r: Any, head: Path | InstalledHead) -> tuple[str, str]:
    """The head on ``r``'s host: a local head directory (its regular files) uploaded to
    ``<data_dir>/heads/<sha256[:12]>``, as the speculate job puts it there and a serving group's rolled hosts get
    the release the canary's gate kept; returns (the path,
    the head's sha256: :func:`eagle3ops.speculate.onhost.head_sha256`). A head already installed from another host
    (``--head HOST:RUN``, :class:`eagle3ops.transfer.weights.InstalledHead`) is not uploaded again; one whose fetch
    was left to the lock's holder (``pending``) is fetched now (not in a dry run).

    Raises:
        SpeculateError: the head directory has no ``config.json``, or the fetch from the other host failed (a file
            refused on arrival, a stream cut; the message names ``--head`` and says to rerun)."""
    if isinstance(head, InstalledHead):
        if head.pending is not None and not r.dry_run:
            from eagle3ops.transfer.weights import WeightsError

            try:
                head.pending()
            except WeightsError as e:
                raise SpeculateError(f"--head {head}: {e}") from None
        return head.dir, head.digest
    files = sorted(p for p in head.iterdir() if p.is_file())
    if not (head / "config.json").is_file():
        raise SpeculateError(f"{head}: no config.json; pass the head's directory (speculators' saved format)")
    digest = head_sha256(head)
    dest = f"{r.host.data_dir}/heads/{digest[:12]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in files:
            tar.add(p, arcname=p.name)
    r.run(hc.mkdir_p(dest))
    r.run(sc.untar_into(dest), stdin=buf.getvalue(), timeout=600)
    return dest, digest


def dry_run_head_check(r: Any, head: Path) -> HeadFacts:
    """The head check of ``speculate --head DIR --dry-run`` (:func:`eagle3ops.speculate.headcheck.check_head`), run
    where the dry run can without changing anything: the head's ``config.json`` and safetensors headers read here,
    the target's ``config.json`` read on the host (``cat``, a read). The checks that need the pipeline image (vLLM's
    reading of the head, d2t/t2d values, the offline estimate) stay with the real run's inspect helper.

    Raises:
        SpeculateError: the head directory has no ``config.json`` or an unreadable safetensors file, the target's
            config cannot be read (``model_path`` named), or the head does not fit (the field and the fix, from
            :class:`~eagle3ops.speculate.headcheck.HeadMismatch`).
    """
    h = r.host
    try:
        head_config = json.loads((head / "config.json").read_text())
        shapes: dict[str, list[int]] = {}
        for f in sorted(head.glob("*.safetensors")):
            shapes.update(safetensors_shapes(f))
    except (OSError, ValueError) as exc:
        raise SpeculateError(f"{head}: cannot read the head ({exc}); pass the head's directory (speculators' saved "
                             "format: config.json and *.safetensors)") from None
    out = r.run(hc.cat(f"{h.model_path}/config.json"), check=False)
    try:
        target = json.loads(out.stdout) if out.ok else None
    except ValueError:
        target = None
    if not isinstance(target, dict):
        raise SpeculateError(f"{h.name}: dry run: the target's {h.model_path}/config.json cannot be read "
                             f"({(out.stderr or '').strip()[-200:] or 'not JSON'}): check hosts.{h.name}.model_path")
    try:
        return check_head(head_config, shapes, target)
    except HeadMismatch as e:
        raise SpeculateError(f"{h.name}: dry run: the head check fails, a real run would refuse {head} before "
                             f"anything changes: {e}") from None


def dry_run_head(r: Any, opts: SpeculateOptions, head_dir: str, echo: Callable[[str], None]) -> None:
    """A dry run's ``--head``, not uploaded (nothing on the host to inspect): a head installed on the host is only
    named (not fetched yet); a local head is checked against the target's config read on the host, the result
    echoed.

    Raises:
        SpeculateError: the local head does not fit the target (:func:`dry_run_head_check`).
    """
    h = r.host
    if isinstance(opts.head, InstalledHead):  # on the host, not fetched yet in a dry run: nothing to read
        echo(f"# dry run: {opts.head.dir} would be fetched and checked against {h.model_path}")
        return
    facts = dry_run_head_check(r, opts.head)
    echo(f"# dry run: {opts.head} would be uploaded to {head_dir}; head check passed against "
         f"{h.model_path}/config.json (read on {h.name}): hidden size {facts.hidden_size}, vocab "
         f"{facts.target_vocab_size} (draft {facts.draft_vocab_size}), aux layers {facts.aux_layer_ids} of "
         f"{facts.target_layers}" + "".join(f"; {w}" for w in facts.warnings)
         + "; the real run also checks the head as vLLM reads it and its offline estimate, on the host")


def inspect_on_host(r: Any, opts: SpeculateOptions, *, run_dir: str, head_dir: str, gate: list[pr.Prompt]) -> dict[str, Any]:
    """The inspect helper's answer (:mod:`eagle3ops.speculate.onhost` in the pipeline image, bounded by
    :data:`INSPECT_TIMEOUT_S`): the head's and the target's configs and shapes, the run's train manifest and
    pipeline.yaml, the gate prompts' disjointness from the run's training chats, and a ``--head``'s offline
    estimate.

    Raises:
        SpeculateError: the run has no trained head (or does not exist), or the helper cannot read head or target.
    """
    h = r.host
    mount_run = r.run(hc.test_dir(run_dir), check=False).ok
    if not r.run(hc.exists(f"{head_dir}/config.json"), check=False).ok:  # before docker would create the bind source
        what = (f"run {opts.run} has no trained head ({head_dir}/config.json is missing)" if mount_run
                else f"run {opts.run} does not exist on {h.name} ({run_dir} is missing)")
        raise SpeculateError(f"{h.name}: {what}: train it first (`eagle3ops train {h.name} --run {opts.run}`), or "
                             "ship a head trained elsewhere with --head DIR")
    res = r.run(sc.gate_helper(h, opts.pipeline_image, "inspect", head_dir=head_dir,
                               run_dir=run_dir if mount_run else None),
                stdin=json.dumps({"gate": [{"id": p.id, "text": p.text} for p in gate],
                                  **({"estimate": {"run": opts.run, "max_tokens": ESTIMATE_MAX_TOKENS}}
                                     if opts.head else {})}), check=False,
                timeout=INSPECT_TIMEOUT_S)
    try:
        return parse_answer(res.stdout)
    except ValueError:
        raise SpeculateError(f"{h.name}: cannot read the head at {head_dir} or the target at {h.model_path}: "
                             f"{res.stderr.strip()[-600:]}; train the run first (eagle3ops train) or pass "
                             "--head DIR") from None
