"""The checks of a ``speculate`` before any serving restart: the invocation's options and
error, and each check of the head, its data and the releases against what the host serves: the offline estimate
against the floor, the chat template the data was rendered with, the head as vLLM 0.16 reads it, and like for like
(the speculative image against the live one), the ``--arg`` flags (with ``--control``, set under each candidate's),
the prompts file's tool rows against the live server's tool
parser and its grammar rows against CPU serving's batching. Pure apart from :func:`_live_image`'s and :func:`check_tool_rows`'s reads of the serving host.
:mod:`eagle3ops.speculate.ship` runs them in order and re-exports them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3ops.commands import docker as dk
from eagle3ops.commands import host as hc
from eagle3ops.commands import serving as sv
from eagle3ops.config.plan import ReleaseChange
from eagle3ops.gate.like import SPECULATIVE_FLAG, flag_names
from eagle3ops.speculate.headcheck import check_vllm_reading, check_vocab_values, offline_acceptance

__all__ = ["SpeculateError", "SpeculateOptions", "TOOL_FLAGS", "check_as_vllm_reads", "check_grammar_batching",
           "check_like_for_like", "check_live_release", "check_offline_floor", "check_template", "check_tool_rows",
           "check_server_args", "grammar_rows", "offline_estimate_for", "unanswered_tool_rows", "with_server_args"]


class SpeculateError(RuntimeError):
    """The head was refused before anything changed, or the gate could not run; the message says why and the fix."""


@dataclass(frozen=True)
class SpeculateOptions:
    """One ``speculate`` invocation.

    Attributes:
        run: the pipeline run (results go to ``<data_dir>/runs/<run>/speculate/``; its head is
            ``train/final`` unless ``head`` is given).
        pipeline_image, pipeline_image_id: the deployed pipeline image (runs the host-side gate and the windows).
        head: a local head directory (trained elsewhere): uploaded to ``<data_dir>/heads/<sha256[:12]>/``.
        serving_image: overrides ``serving.speculative_image``.
        force: accept a head whose offline acceptance estimate is below the floor (or, from elsewhere, that the
            host could not estimate).
        allow_template_mismatch: ship a head whose run's data was rendered with another chat template than the
            live release's (:func:`check_template`).
        with_humaneval: with ``prompts_file``, also replay HumanEval's gate split (``prompts`` of them) as the
            prompt set ``code`` after the file's prompts; the result has one table per set.
        control: measure a control release (the speculative image without ``--speculative-config``, every other
            flag equal) as the baseline, one more serving restart; needed when the speculative image differs from
            the live one (:func:`check_like_for_like`).
        margin: overrides ``serving.gate_margin``; negative only with the test-only switch
            ``EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN=1`` (tests name one to exercise the keep branch).
        acceptance_floor: overrides ``serving.acceptance_floor`` (both the offline-estimate check and the gate).
        max_tokens, prompts, passes: override ``serving.gate_max_tokens`` / ``serving.gate_prompts`` /
            ``serving.gate_passes``.
        accept_low_power: measure even when the gate's power at x1.30 is below 80 % (:mod:`.power`); also
            ``serving.gate_accept_low_power``.
        prompts_file: a JSONL file of prompts (:func:`eagle3ops.speculate.prompts.from_jsonl`) replayed instead of
            HumanEval's gate split: all of them, in file order (``prompts`` / ``serving.gate_prompts`` then do not
            apply).
        command: the command line, for the audit log.
    """

    run: str
    pipeline_image: str
    pipeline_image_id: str | None = None
    head: Path | None = None
    serving_image: str | None = None
    force: bool = False
    margin: float | None = None
    acceptance_floor: float | None = None
    max_tokens: int | None = None
    prompts: int | None = None
    passes: int | None = None
    accept_low_power: bool = False
    prompts_file: Path | None = None
    allow_template_mismatch: bool = False
    control: bool = False
    with_humaneval: bool = False
    #: Speculation methods to measure (``--method``; :data:`eagle3ops.commands.speculate.METHODS`) and speculative
    #: lengths (``--k``; empty: the head's ``ttt_steps``): one candidate each (method x k); with more than one the
    #: host's job measures every candidate and confirms the best.
    methods: tuple[str, ...] = ("eagle3",)
    ks: tuple[int, ...] = ()
    #: The EAGLE-3 draft's tensor parallelism to measure (``--draft-tp``; empty: the target's, vLLM's default):
    #: one EAGLE-3 candidate each; vLLM 0.16 takes 1 or the target's TP (on a PCIe host the choice matters most).
    draft_tps: tuple[int, ...] = ()
    #: Server flags (``--arg``) set on the speculative release and on its control baseline alike, as ``release
    #: --arg`` sets them (each replaces the same flag of the live command line): what a speculative image of
    #: another vLLM needs to start (e.g. ``--block-size=32`` for vLLM 0.32's CPU attention). Needs ``control``.
    args: tuple[str, ...] = ()
    command: str = "eagle3ops speculate"


def offline_estimate_for(opts: SpeculateOptions, info: dict[str, Any]) -> float | None:
    """The offline acceptance estimate that applies to the head being shipped: the run's train manifest's
    (:func:`~eagle3ops.speculate.headcheck.offline_acceptance`) for the run's own head; for a head passed with
    ``head`` (trained elsewhere: the run's manifest describes another head) the host's estimate of it on the run's
    held-out hidden states (the inspect answer's ``estimate``, :mod:`eagle3ops.stages.estimate`), None when the
    host could not make one."""
    if opts.head:
        value = (info.get("estimate") or {}).get("acceptance_length")
        return None if value is None else float(value)
    return offline_acceptance(info.get("train_manifest"))


def check_template(h: Any, opts: "SpeculateOptions", info: dict[str, Any], served: Any) -> list[str]:
    """The run's training data against the live release's chat template, before any restart:
    the prepare manifest's ``chat_template_sha256`` (the inspect answer's ``prepare_template``) against serving's
    ``--chat-template`` (``served``: :func:`eagle3ops.window.served_template.read_served_template`) or, without one,
    the target tokenizer's own (``tokenizer_template_sha256``).

    Returns:
        warnings for a check that could not run (a head from elsewhere: its training template is unknown here; no
        prepare manifest; a tokenizer that did not load), or for a mismatch allowed by ``allow_template_mismatch``.

    Raises:
        SpeculateError: the templates differ (without ``allow_template_mismatch``), naming both sha256, where each
            comes from, and the fixes.
    """
    if opts.head:
        return [f"{opts.head}: a head from elsewhere: the chat template it was trained with is unknown here (not "
                "compared with the live release's)"]
    data = info.get("prepare_template") or {}
    data_sha = data.get("chat_template_sha256")
    live_sha = served.sha256 if served is not None else info.get("tokenizer_template_sha256")
    live_from = served.origin if served is not None else "no --chat-template: the target tokenizer's own"
    if not data_sha or not live_sha:
        return [f"chat template not compared: {'the run has no prepare manifest with it' if not data_sha else 'the target tokenizer did not load on the host'}"]
    if data_sha == live_sha:
        return []
    what = (f"run {opts.run}'s training data was rendered with chat template {data_sha[:16]}... "
            f"({data.get('chat_template_source') or 'source not recorded'}), the live release renders with "
            f"{live_sha[:16]}... ({live_from})")
    if opts.allow_template_mismatch:
        return [f"{what}; shipped anyway (--allow-template-mismatch)"]
    raise SpeculateError(f"{h.name}: {what}: the head would meet another text than it was trained on. Rerun the "
                         f"extract window (`prepare.chat_template: auto`, the default, renders the data with the "
                         f"template serving uses), or pass --allow-template-mismatch")


def check_like_for_like(h: Any, live: tuple[str | None, str | None], speculative: tuple[str, str | None],
                        control: bool, server_args: Sequence[str] = ()) -> dict[str, Any]:
    """The speculative release's image against the live one's, before anything changes (like for like;
    the host checks the measured releases again: :func:`eagle3ops.gate.like.unlike`).

    Args:
        live, speculative: ``(image reference, image id or None)`` of the live serving container and of the
            speculative image on the host (None id: not on the host yet; then references are compared).
        control: ``--control`` was given.
        server_args: the ``--arg`` flags (:attr:`SpeculateOptions.args`): with them the live image's control
            release differs from the live one by those flags, so ``--control`` is not refused for the same image.

    Returns:
        the figures for the result: ``{"live_image", "speculative_image", "like_for_like", "control"}``
        (``like_for_like`` None when the live container was not found: the host's check then decides).

    Raises:
        SpeculateError: the images differ and ``control`` is False, naming both and the two fixes; or
            ``control`` is given for images that are the same and no ``server_args`` (nothing to control for).
    """
    (live_ref, live_id), (spec_ref, spec_id) = live, speculative
    if live_ref is None and live_id is None:  # no serving container found: the job's record step will say so,
        return {"live_image": None, "speculative_image": {"image": spec_ref, "image_id": spec_id},  # and the host
                "like_for_like": None, "control": control}                         # compares what it measured
    same = live_id == spec_id if live_id and spec_id else live_ref == spec_ref
    figures = {"live_image": {"image": live_ref, "image_id": live_id},
               "speculative_image": {"image": spec_ref, "image_id": spec_id}, "like_for_like": same,
               "control": control}
    if not same and not control:
        raise SpeculateError(
            f"{h.name}: live serving runs {live_ref} (image {live_id or 'id unknown'}), the speculative release "
            f"would run {spec_ref} (image {spec_id or 'not on the host yet'}): a ratio across unlike images mixes "
            f"the image's own speed with speculation's. Pass --control to measure {spec_ref} without "
            f"--speculative-config (every other flag equal) as the baseline (one more serving restart), or serve "
            f"the baseline on it first (`eagle3ops release {h.name} --image {spec_ref}`) and speculate again")
    if same and control and not server_args:
        raise SpeculateError(f"{h.name}: --control: the speculative release runs the live image ({live_ref}): the "
                             "live release is the like-for-like baseline already; drop --control")
    return figures


def _live_image(r: Any) -> tuple[str | None, str | None]:
    """``(image reference, image id)`` of the host's serving container (read-only); ``(None, None)`` without one."""
    from eagle3ops.window.kinds import serving_container

    names, _ = serving_container(r)
    if not names:
        return None, None
    out = r.run(dk.inspect_format(r.host, names[0], "{{.Config.Image}} {{.Image}}", kind="container"), check=False)
    parts = out.stdout.split() if out.ok else []
    return (parts[0], parts[1]) if len(parts) == 2 else (None, None)


def check_offline_floor(h: Any, opts: SpeculateOptions, info: dict[str, Any], floor: float) -> tuple[float | None,
                                                                                                      list[str]]:
    """The offline estimate against ``serving.acceptance_floor``, before any restart.

    Returns:
        (the estimate or None, warnings): a run's own head without an estimate in its manifest is a warning; a
        head from elsewhere that the host could not estimate is one only with ``force``.

    Raises:
        SpeculateError: the estimate is below ``floor`` (without ``force``), naming the estimate, where it was
            measured, the floor and the fix; or a head from elsewhere could not be estimated (without ``force``),
            naming why and how to give the host hidden states to estimate it on.
    """
    offline = offline_estimate_for(opts, info)
    if opts.head:
        est = info.get("estimate") or {}
        if offline is None:
            why = est.get("unavailable") or ("the pipeline image answered no estimate (it predates this check: "
                                             "rebuild and deploy it)")
            if not opts.force:
                raise SpeculateError(
                    f"{h.name}: {opts.head}: a head from elsewhere is estimated before any restart, and this one "
                    f"could not be: {why}. Give the host hidden states of this target to estimate it on "
                    f"(`eagle3ops extract {h.name} --run {opts.run}`, with aux layers the head was trained on), "
                    "or pass --force to measure it anyway (two serving restarts if it is rolled back)")
            return None, [f"{opts.head}: not estimated before the release ({why}); measured anyway (--force)"]
        if offline < floor and not opts.force:
            raise SpeculateError(
                f"{h.name}: {opts.head}: offline acceptance estimate {offline:.3f} on {est.get('source')} "
                f"({est.get('held_out_samples')} samples, {est.get('held_out_tokens')} tokens; per position "
                f"{est.get('per_position')}) is below the floor {floor} (serving.acceptance_floor); ship another "
                "head, or pass --force to measure it anyway")
        return offline, []
    if offline is None:
        return None, ["the train manifest has no offline acceptance estimate: floor not checked before release"]
    if offline < floor and not opts.force:
        raise SpeculateError(f"{h.name}: run {opts.run}: offline acceptance estimate {offline:.3f} is below the "
                             f"floor {floor} (serving.acceptance_floor); train longer, or pass --force "
                             "to measure it anyway")
    return offline, []


def check_as_vllm_reads(info: dict[str, Any], facts: Any, *, own_run: bool) -> list[str]:
    """The head as vLLM 0.16 reads it, from the inspect answer: its config through vLLM's own
    loader in the pipeline image (:func:`.headcheck.check_vllm_reading`; the run's train manifest says which aux
    layers it was trained on when the head is the run's own) and the values of ``d2t``/``t2d``
    (:func:`.headcheck.check_vocab_values`). Runs before any restart, in ``--dry-run`` too.

    Returns:
        warnings for checks that could not run (an image without vLLM, or older than this check).

    Raises:
        HeadMismatch: naming the head's key and what vLLM 0.16 would do instead.
    """
    warnings: list[str] = []
    view = info.get("vllm_view")
    if view and not view.get("error"):
        check_vllm_reading(info["head_config"], view, target_layers=facts.target_layers,
                           train_manifest=info.get("train_manifest") if own_run else None)
    else:
        warnings.append("the head's config was not read through vLLM's own loader (" + (
            (view or {}).get("error") or "the pipeline image predates this check: rebuild it") + ")")
    vocab = info.get("vocab")
    if vocab and vocab.get("d2t") is not None:
        check_vocab_values(vocab["d2t"], vocab.get("t2d"), target_vocab=facts.target_vocab_size)
    elif vocab is None:
        warnings.append("d2t/t2d values not checked (the pipeline image predates this check: rebuild it)")
    return warnings


#: The flags without which vLLM 0.16 makes no tool parser (``ParserManager.get_tool_parser`` returns None unless
#: both are given) and then answers a chat request whose ``tool_choice`` is neither absent-without-tools nor
#: ``none`` with HTTP 400 (``OpenAIServingChat``: '"auto" tool choice requires --enable-auto-tool-choice and
#: --tool-call-parser to be set', 'tool_choice="required" requires --tool-call-parser to be set'); a request with
#: ``tools`` and no ``tool_choice`` is ``auto`` (``ChatCompletionRequest.check_tool_usage``).
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")


def _served_flags(argv: Sequence[str]) -> dict[str, str | None]:
    """``{--flag: value}`` of a server's command line (``--a=b`` and ``--a b``; underscores read as dashes, as
    vLLM's argument parser does); a flag without a value maps to None."""
    out: dict[str, str | None] = {}
    words = list(argv)
    for i, w in enumerate(words):
        if not w.startswith("--"):
            continue
        name, eq, value = w.partition("=")
        nxt = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        out[name.replace("_", "-")] = value if eq else nxt
    return out


def unanswered_tool_rows(gate: Sequence[Any], argv: Sequence[str], model_type: str | None) -> list[str]:
    """The ids of the chat bodies among ``gate`` (:class:`eagle3ops.speculate.prompts.Prompt`) that a vLLM 0.16
    server started with ``argv`` answers with HTTP 400 for their tools (pure): a non-empty ``tools`` with
    ``tool_choice`` absent, ``auto``, ``required`` or a named function, while the server lacks one of
    :data:`TOOL_FLAGS`. None are where vLLM parses tools without them (``--tokenizer-mode mistral``; a harmony
    model, ``model_type: gpt_oss``; a Mistral-family ``model_type``, whose tokenizer vLLM may pick itself) or where
    the flags may come from a ``--config`` file (not judged)."""
    flags = _served_flags(argv)
    mt = (model_type or "").lower()
    if (all(f in flags for f in TOOL_FLAGS) or "--config" in flags or flags.get("--tokenizer-mode") == "mistral"
            or mt == "gpt_oss" or "mistral" in mt or "pixtral" in mt):
        return []
    return [p.id for p in gate if p.body is not None and p.body.get("tools")
            and p.body.get("tool_choice", "auto") not in (None, "none")]


def check_tool_rows(r: Any, gate: Sequence[Any], prompts_file: Path | None) -> None:
    """Refuse, before anything is written on the host, a gate whose chat bodies carry ``tools`` that the live
    server answers with HTTP 400 (:func:`unanswered_tool_rows`): they would fail on the baseline and the
    speculative release alike, and the gate would spend its serving restarts on a rollback. Read-only: the live
    server's command line (:meth:`eagle3ops.window.kinds.DriverKind.served_argv`) and the target's ``config.json``
    (its ``model_type``), only when some row has ``tools``; nothing is judged without a live server (preflight
    names that).

    Raises:
        SpeculateError: such rows; the message names the file, the rows, the missing flags and both fixes.
    """
    if not any(p.body is not None and p.body.get("tools") for p in gate):
        return
    from eagle3ops.window.kinds import driver_kind

    h = r.host
    found = driver_kind(h).served_argv(r)
    if found is None:
        return
    argv, _, where = found
    cfg = r.run(hc.cat(f"{h.model_path}/config.json"), check=False)
    try:
        model_type = (json.loads(cfg.stdout) or {}).get("model_type") if cfg.ok else None
    except (ValueError, AttributeError):
        model_type = None
    ids = unanswered_tool_rows(gate, argv, model_type)
    if not ids:
        return
    missing = " and ".join(f for f in TOOL_FLAGS if f not in _served_flags(argv))
    lead, rows = _bodies_said(h.name, prompts_file, ids)
    raise SpeculateError(
        f"{lead} with `tools` ({rows}) would be answered HTTP 400 by the live server: {where} runs without "
        f"{missing}, so vLLM has no tool parser and refuses tool_choice auto/required, on the baseline and the "
        f"speculative release alike, and the gate would restart serving for a rollback. Serve with "
        f"`--enable-auto-tool-choice "
        f"--tool-call-parser <the model's parser>` as production answers tools, or give those rows "
        f"\"tool_choice\": \"none\" (or drop their tools); nothing was restarted")


def _bodies_said(host: str, prompts_file: Path | None, ids: list[str]) -> tuple[str, str]:
    """How a refusal names the chat bodies ``ids`` of ``prompts_file`` on ``host`` (pure): its lead (``h:
    --prompts-file F: 2 chat bodies``) and the rows (the first five ids, then how many more)."""
    rows = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return f"{host}: --prompts-file {prompts_file}: {len(ids)} chat bod{'y' if len(ids) == 1 else 'ies'}", rows


#: ``response_format`` types vLLM 0.16 turns into a grammar (``ChatCompletionRequest.to_sampling_params``:
#: ``json_object``, ``json_schema``, ``structural_tag`` set ``structured_outputs``; ``text`` sets none).
GRAMMAR_FORMATS = ("json_object", "json_schema", "structural_tag")


def grammar_rows(gate: Sequence[Any]) -> list[str]:
    """The ids of the chat bodies among ``gate`` (:class:`eagle3ops.speculate.prompts.Prompt`) that vLLM 0.16
    decodes under a grammar (pure): a ``response_format`` of a :data:`GRAMMAR_FORMATS` type, vLLM's own
    ``structured_outputs`` or ``guided_*`` fields, or ``tools`` with ``tool_choice`` ``required`` or a named
    function (``ToolParser.adjust_request`` then sets a JSON schema of the tools). Plain prompts have none."""
    def grammar(b: dict[str, Any]) -> bool:
        rf, choice = b.get("response_format"), b.get("tool_choice")
        return ((isinstance(rf, dict) and rf.get("type") in GRAMMAR_FORMATS) or bool(b.get("structured_outputs"))
                or any(b.get(k) is not None for k in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"))
                or (bool(b.get("tools")) and (choice == "required" or isinstance(choice, dict))))
    return [p.id for p in gate if p.body is not None and grammar(p.body)]


def check_grammar_batching(h: Any, gate: Sequence[Any], prompts_file: Path | None) -> None:
    """Refuse, before anything is written on the host, a gate that would batch a request decoded under a grammar
    (:func:`grammar_rows`) beside one without on a CPU serving host (``gpus: 0`` or ``serving.gpus: none``, as
    :func:`eagle3ops.commands.serving.inventory_drift` reads GPU use) at a concurrency above 1
    (``serving.gate_concurrency``). Pure: the inventory's host ``h`` and the gate's prompts.

    Why: vLLM 0.16's ``apply_grammar_bitmask`` (``vllm/v1/structured_output/utils.py``) builds its index tensor with
    ``pin_memory=True`` whenever the batch holds rows without a grammar; its CPU build has no CUDA, so the
    EngineCore dies with ``RuntimeError: Found no NVIDIA driver on your system`` (seen on the sandbox's CPU vLLM,
    ``docs/measured/faults-retried.md``), on the baseline and the speculative release alike: the gate would
    measure crashes and restart serving for a rollback. A structured request alone, or a batch of only structured
    requests, takes the path without the index tensor; GPU hosts pin memory with CUDA present.

    Raises:
        SpeculateError: such a gate; the message names the file, the rows, the concurrency, the cause and the fixes.
    """
    s = h.serving
    levels = [c for c in s.gate_concurrency if c > 1]
    if not levels or not (h.gpus == 0 or s.gpus in ("none", 0)):
        return
    ids = grammar_rows(gate)
    if not ids or len(ids) == len(gate):
        return
    lead, rows = _bodies_said(h.name, prompts_file, ids)
    raise SpeculateError(
        f"{lead} decoded under a grammar (`response_format`, a required or named tool call: {rows}) would be "
        f"batched beside the {len(gate) - len(ids)} other prompt(s) at concurrency {max(levels)} "
        f"(hosts.{h.name}.serving.gate_concurrency) on CPU serving; vLLM 0.16's CPU build kills its EngineCore on "
        f"such a batch (apply_grammar_bitmask builds its index tensor with pin_memory=True: \"Found no NVIDIA "
        f"driver on your system\"), on the baseline and the speculative release alike, and the gate would restart "
        f"serving for a rollback. Gate this set with `gate_concurrency: [1]` under hosts.{h.name}.serving, or give "
        f"the grammar rows a prompts file of their own (every row with a grammar, or none); nothing was restarted")


def check_live_release(r: Any, opts: SpeculateOptions, image: str, gate: Sequence[Any], *, serves_image: bool
                       ) -> dict[str, Any]:
    """The read-only checks of a ``speculate`` against what the host serves, before anything is written there:
    where serving runs an image (``serves_image``), the speculative ``image`` (no stand-in, the host's architecture,
    like for like with the live one or ``--control``: :func:`check_like_for_like`), else no ``--control``; then the
    prompts file's tool rows the live server would answer with HTTP 400 (:func:`check_tool_rows`) and its grammar
    rows CPU serving would crash on (:func:`check_grammar_batching`). Returns the like-for-like figures.

    Raises:
        SpeculateError: a check refuses (the message names the fix).
    """
    from eagle3ops.window.arch import refuse_foreign_image
    from eagle3ops.window.standin import refuse_standin_image

    h = r.host
    like: dict[str, Any] = {"like_for_like": True, "control": False}
    if serves_image:  # a process serves no image
        refuse_standin_image(r, image, "speculate")  # read-only; before anything is written on the host
        foreign = refuse_foreign_image(r, image, "speculate")  # an image the host lacks: the push refuses it
        if foreign:
            raise SpeculateError(foreign)
        spec_id = r.run(dk.image_id(h, image), check=False)
        like = check_like_for_like(h, _live_image(r), (image, (spec_id.stdout.strip() or None) if spec_id.ok else None),
                                   opts.control, opts.args)
    elif opts.control:
        raise SpeculateError(f"{h.name}: --control: this host serves with a {h.serving.kind} (no image): its "
                             "speculative release differs from the live one by --speculative-config only, like for "
                             "like already; drop --control" + (
                                 f" and set the --arg flags on the live release first (`eagle3ops release {h.name} "
                                 f"--arg ...`)" if opts.args else ""))
    check_tool_rows(r, gate, opts.prompts_file)
    check_grammar_batching(h, gate, opts.prompts_file)
    return like


def check_server_args(name: str, opts: SpeculateOptions) -> None:
    """The ``--arg`` flags of a ``speculate`` on host ``name`` (``opts.args``), before the host is reached (pure).

    Raises:
        SpeculateError: flags without ``--control`` (the baseline would be the live release without them, and the
            host's like-for-like check sets the change's flags aside, so the ratio would mix the flags' own speed
            with speculation's), or a flag speculate sets itself (``--speculative-config``); the message names the
            flag and the fix.
    """
    if not opts.args:
        return
    if SPECULATIVE_FLAG in flag_names(opts.args):
        raise SpeculateError(f"{name}: --arg {SPECULATIVE_FLAG}: speculate sets it from the head (--k, --draft-tp, "
                             "--method); to gate a speculative config of your own: `eagle3ops release "
                             f"{name} --gate --arg {SPECULATIVE_FLAG} --arg JSON`")
    if not opts.control:
        # flag names only: a value may be a secret (an --api-key), and this runs before the inventory is read
        raise SpeculateError(f"{name}: --arg {', '.join(sorted(flag_names(opts.args)))}: the flags are set on the "
                             "speculative release and on its control baseline alike, so they need --control (the "
                             "live release lacks them, and a ratio against it would mix their own speed with "
                             "speculation's); pass "
                             f"--control, or release them first (`eagle3ops release {name} --arg ...`) and "
                             "speculate without --arg")


def with_server_args(name: str, change: ReleaseChange, args: tuple[str, ...] | list[str]) -> ReleaseChange:
    """``change`` (a speculative candidate's) with the ``--arg`` flags ``args`` under it (pure): the flags are set
    by the same rule a release sets its ``--arg`` flags on the live command line
    (:func:`eagle3ops.commands.serving.set_args`), the candidate's own over them; the control release keeps them
    (:func:`eagle3ops.gate.like.control_change` drops ``--speculative-config`` only).

    Raises:
        SpeculateError: a flag of ``args`` that the candidate sets itself (e.g. ``--override-generation-config``
            on a CPU host of vLLM 0.16), named.
    """
    if not args:
        return change
    clash = sorted(flag_names(args) & flag_names(change.args))
    if clash:
        raise SpeculateError(f"{name}: --arg {', '.join(clash)}: the speculative release sets "
                             f"{'it' if len(clash) == 1 else 'them'} itself ({' '.join(change.args)}); drop "
                             f"{'it' if len(clash) == 1 else 'them'} from --arg")
    return change.model_copy(update={"args": sv.set_args(list(args), list(change.args))})

