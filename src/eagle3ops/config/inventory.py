"""Inventory models: ``deploy/hosts.yaml`` validated with pydantic, errors naming file, key and fix.

Every key has a type, a default (where one is safe) and a one-line doc (the ``description``); unknown keys are
errors. ``eagle3ops config docs inventory`` prints this documentation from the models themselves (Kamal's
``configuration/docs`` idea); the example is ``deploy/hosts.yaml``.

Why this module is long: it is the inventory's schema, one field per key with the description that ``config docs``
prints; splitting it would scatter one section's keys (``serving`` alone has the gate's) across modules.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from eagle3ops.config.base import ConfigError, StrictModel, read_yaml, require_mapping, validate
from eagle3ops.config.enginevalues import (Bind, ContainerName, CpuSet, EnvName, EnvValue, SecretEnvName,
                                           container_name, cpu_ids, host_path)
from eagle3ops.config.fleet import FleetConfig
from eagle3ops.config.groups import GroupConfig, check_groups

DEFAULT_INVENTORY = Path("deploy/hosts.yaml")
SECTION = "inventory"


#: Test-only switch: set to ``1`` to allow a negative ``serving.gate_margin`` / ``speculate --margin`` (a test that
#: exercises the keep branch where speculation cannot win, e.g. a random head on the sandbox). Never in production.
NEGATIVE_MARGIN_ENV = "EAGLE3OPS_TEST_ALLOW_NEGATIVE_MARGIN"


def check_gate_margin(value: float) -> float:
    """``value`` when it is a usable gate margin: a finite number from 0 to below 1, or negative (above -1) only while
    the test-only switch :data:`NEGATIVE_MARGIN_ENV` is ``1``.

    Raises:
        ValueError: not a finite number or 1 or more (``release --gate`` keeps what is not slower than ``1 - margin``:
            such a gate keeps anything), a negative margin without the switch (a gate that keeps a release slower
            than the baseline), or -1 or less; the message says the fix.
    """
    if not math.isfinite(value) or value >= 1.0:
        raise ValueError(f"gate margin {value} must be a number from 0 to below 1 (e.g. 0.05: keep only what is "
                         f"measured 5 % faster, or for release --gate not more than 5 % slower)")
    if value <= -1.0:
        raise ValueError(f"gate margin {value} must be above -1 (0 or more outside tests)")
    if value < 0 and os.environ.get(NEGATIVE_MARGIN_ENV) != "1":
        raise ValueError(f"gate margin {value} is negative: the gate would keep a speculative release slower than "
                         f"the baseline. Use 0 or more (e.g. 0.05); only tests may set a negative one, through the "
                         f"test-only switch {NEGATIVE_MARGIN_ENV}=1")
    return value


#: Serving kinds a host's ``serving.kind`` may name.
SERVING_KINDS = ("container", "compose", "process", "systemd", "none")


class WatchPolicy(StrictModel):
    """`eagle3ops watch HOST`'s policy for the live release (`serving.watch`): what counts as a breach, for how long
    it must last, and whether a sustained breach rolls the host back to the non-speculative release. Only intervals
    with traffic count (an interval with no draft round, or no finished request, neither breaches nor clears)."""

    acceptance_floor: float | Literal["break-even"] | None = Field(
        "break-even", description="Least mean acceptance length (1 + accepted / drafts over one interval, from "
                                  "vLLM's /metrics) of the live speculative release: a number (at least 1), "
                                  "`break-even` (the acceptance length at which the gate's measured speed-up for "
                                  "this release would be x1.00: the gate's mean acceptance length / its throughput "
                                  "ratio at production concurrency, assuming a speculative step's cost does not "
                                  "depend on how many tokens it accepts; `serving.acceptance_floor` when no gate "
                                  "result names this release), or null (acceptance not checked).")
    sustained_minutes: float = Field(
        10.0, gt=0, description="A breach is reported (and acted on) only once every interval with traffic has "
                                "breached for at least this many minutes in a row.")
    throughput_drop: float | None = Field(
        None, gt=0, lt=1, description="Fraction (e.g. 0.1) by which the live release's per-request output tokens/s "
                                      "(Δ `vllm:request_generation_tokens` sum / Δ `vllm:e2e_request_latency_seconds`"
                                      " sum) may fall below the gate's baseline (the non-speculative release's "
                                      "output tokens/s at production concurrency / that concurrency) before it is "
                                      "a breach; null: not checked. Production's request lengths differ from the "
                                      "gate's: choose a generous fraction.")
    rollback: bool = Field(
        False, description="On a sustained breach, roll back to the gate's baseline release (the non-speculative "
                           "one) through the usual locked, health-gated rollback window; false: report only.")
    interval_s: float = Field(60.0, ge=1, description="Default seconds between two /metrics scrapes (`--interval`).")

    @field_validator("acceptance_floor")
    @classmethod
    def _floor(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, (int, float)) and v < 1.0:
            raise ValueError(f"acceptance_floor {v}: a mean acceptance length is at least 1 (1 = nothing "
                             "accepted); use e.g. 1.5, `break-even` or null")
        return v


class ServingConfig(StrictModel):
    """How production serving runs on a host: one vLLM container, described the way ``docker run`` takes it; a vLLM
    process (``kind: process``); or ``kind: none`` (shorthand ``serving: none``) for a host that only trains."""

    kind: Literal["container", "compose", "process", "systemd", "none"] = Field(
        "container",
        description="Serving manager: `container` (a Docker container by name), `compose` (the container of a "
                    "Compose service, found by its `com.docker.compose.project`/`.service` labels), `process` (vLLM "
                    "run as a plain process on the host, e.g. from a virtualenv, found by `process_match`; its "
                    "command line, environment, working directory and user are recorded from /proc, it is stopped "
                    "with SIGTERM and restored detached by a restore agent on the host, logging to the window's "
                    "state dir; it must run as the SSH user; windows, release (server flags and environment only) and "
                    "rollback, each gated with a rollback to the recorded process, and speculate (its releases differ by "
                    "flags only)), `systemd` (a "
                    "systemd unit named by `unit`, e.g. `vllm.service`: its ExecStart and Environment are recorded "
                    "with `systemctl show`, it is stopped and started with `systemctl stop|start` by the same "
                    "restore agent on the host, as the SSH user, who must be allowed to; windows, release (server "
                    "flags and environment only, written as the drop-in `/etc/systemd/system/<unit>.d/"
                    "50-eagle3ops-release.conf`, mode 0600, then `systemctl daemon-reload` and a restart) and "
                    "rollback (the drop-in replaced or removed), each gated, and speculate (each of the gate's "
                    "restarts such a drop-in switch); tested against "
                    "systemd 252 with stand-in server processes) or `none` (a "
                    "host that only trains, e.g. a rented training host: windows skip the stop, the restore and the "
                    "health gate and say so; release, rollback and speculate refuse it). Write `serving: none` or "
                    "`serving: {kind: none}`, with no other serving keys.",
    )
    container: ContainerName = Field("vllm-serving", description="Name of the serving container on the host (kind container).")
    compose_project: str | None = Field(
        None, description="Compose project name (kind compose), as `docker compose -p` / `name:` sets it."
    )
    compose_service: str | None = Field(None, description="Compose service name (kind compose), e.g. `vllm`.")
    process_match: str | None = Field(
        None, description="Kind process: an extended regular expression matched against the serving process's "
                          "whole command line (`pgrep -o -f`; the oldest match is the server), e.g. "
                          "`ml-env/bin/vllm serve`.")
    unit: str | None = Field(
        None, description="Kind systemd: the systemd unit that runs vLLM on the host, e.g. `vllm.service` (letters, "
                          "digits and `:_.@-`; `systemctl` adds `.service` when no suffix is given). Example: `serving: {kind: "
                          "systemd, unit: vllm.service, port: 8000, served_model_name: kimi-k2.5}`.")
    image: str | None = Field(None, description="Serving image reference, e.g. `vllm/vllm-openai:v0.16.0` "
                                                "(required unless `kind: none`).")
    args: list[str] = Field(
        default_factory=list, description="Arguments passed to the image's entrypoint (`vllm serve` args)."
    )
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="Environment of the serving container.")
    volumes: list[Bind] = Field(
        default_factory=list, description="Bind mounts `HOST_PATH:CONTAINER_PATH[:ro]` for the serving container."
    )
    port: int = Field(8000, ge=1, le=65535, description="TCP port the server listens on (host network).")
    served_model_name: str | None = Field(
        None, description="Model name that `/v1/models` must list (required unless `kind: none`).")
    gpus: Literal["all", "none"] | int = Field(
        "all", description="GPUs given to the container: `all`, `none`, or a count."
    )
    shm_size: str | None = Field(None, description="`--shm-size` for the container, e.g. `16g`.")
    cpuset_cpus: CpuSet | None = Field(
        None, description="CPUs the serving container may run on (`docker run --cpuset-cpus`: ids and ranges, e.g. "
                          "`0-31` or `1`; kinds container and compose), so that other work on the machine (another "
                          "serving container, a window's stages) cannot take its cores. vLLM CPU's default thread "
                          "binding (`VLLM_CPU_OMP_THREADS_BIND` unset or `auto`) binds its OpenMP threads to the "
                          "CPUs the container may use, one per core; an explicit list in `env` must lie inside this "
                          "set. Applies where serving is provisioned from the inventory; a release keeps the live "
                          "container's CPU set (`config check HOST` reports a difference: `docker update "
                          "--cpuset-cpus`, then a release, which restarts vLLM so that it binds again). Default: "
                          "every CPU.")
    health_timeout_s: float = Field(
        1800.0, gt=0, description="How long the restore health gate waits for a (slow) server start, in seconds."
    )
    stop_timeout_s: int = Field(120, ge=1, description="Graceful stop timeout before SIGKILL, in seconds.")
    api_key_file: str | None = Field(
        None, description="Absolute path, on the host, of a file whose first line is the API key serving requires "
                          "(`vllm serve --api-key`), for the health gate when the serving container's own "
                          "`--api-key`/`VLLM_API_KEY` does not show it (e.g. read by its entrypoint from a mounted "
                          "secret). Read on the host by the supervisor; the key itself never leaves the host.",
    )

    @field_validator("api_key_file")
    @classmethod
    def _absolute_key_file(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path on the host, got {value!r}")
        return value if value is None else host_path(value)  # mounted into the supervisor at the same path
    gate_concurrency: list[int] = Field(
        default_factory=lambda: [1, 8], min_length=1,
        description="Concurrency levels at which `eagle3ops speculate` measures both releases; the first is the "
                    "host's production concurrency (the one that decides keep or rollback).",
    )
    gate_margin: float = Field(
        0.05, gt=-1.0, description="Keep a speculative release only when the lower bound of the 90 % interval of "
                                   "its output tokens/s over the baseline's at production concurrency is at least "
                                   "1 + gate_margin; baseline drift beyond half of it makes the gate undecided. 0 or "
                                   f"more (a negative margin only in tests, with {NEGATIVE_MARGIN_ENV}=1).",
    )
    gate_passes: int = Field(
        5, ge=3, description="Passes per release at each gate concurrency (the same prompts in the same order each "
                             "pass); the throughput interval is a t interval over the passes' log tokens/s, so more "
                             "passes narrow it. At least 3. `speculate` prints the gate's power (its chance to keep "
                             "a release truly x1.30 faster) for this many passes at the host's recorded pass CV and "
                             "refuses below 80 % unless gate_accept_low_power.",
    )
    gate_design: Literal["aba", "ab"] = Field(
        "aba", description="Order of the gate's passes. `aba`: the baseline restarted and measured, the speculative "
                           "release measured, the baseline restarted and measured again (its passes split between "
                           "the two blocks, rounded up), so that a drift of the host's speed linear in time and a "
                           "restarted server's own speed cancel; a rejected release then already serves the "
                           "baseline, a kept one costs one more restart (3 restarts to reject, 4 to keep; with "
                           "--control 4 either way). `ab`: the live baseline, then the speculative release (1 restart "
                           "to keep, 2 to reject): for a host whose restarts are too slow for two more; the result "
                           "then says the shift between the blocks was not measured. Several candidates (--method / "
                           "--k) are measured `ab`.",
    )
    gate_accept_low_power: bool = Field(
        False, description="Let `speculate` measure when the gate's planned power at x1.30 is below 80 % (else it "
                           "refuses before any restart, naming the passes needed; `--accept-low-power` does the same "
                           "for one run). For a demonstration host sized for time, not for the outcome.",
    )
    gate_warmup_prompts: int = Field(
        4, ge=0, description="Prompts (the gate's first ones) sent at each gate concurrency before each release's "
                             "measured passes and not measured: a freshly started vLLM serves its first requests "
                             "slower (on the sandbox's CPU SmolLM2 the first baseline pass of 64 prompts ran at 22.1 "
                             "output tokens/s, the next two at 30.0 and 29.7). 0 = none.",
    )
    gate_traffic: Literal["idle", "live"] = Field(
        "idle", description="What the gate measures beside. `idle`: production free of other traffic (each pass "
                            "waits until serving is idle; a client's request during a pass makes the verdict "
                            "undecided), so a host with clients needs `drain_hook` and they are off it for the whole "
                            "gate. `live`: measured beside the clients' own traffic, which stays on production except "
                            "during the restarts (no idle wait; the other requests seen in each pass recorded as "
                            "`foreign_requests` / `foreign_mean`, not refused): assumes that traffic is about as heavy "
                            "through the whole gate, which the `aba` order checks (a change of it between the "
                            "baseline's two blocks is the drift that makes the verdict undecided), and the "
                            "interval carries its noise. Needs `gate_design: aba` and no `drain_hook`; the mean "
                            "acceptance length is then the served one over the gate's and the clients' requests.",
    )
    drain_hook: list[str] | None = Field(
        None, description="Argv run before a speculate job measures anything, to take clients off this server (e.g. "
                          "`[curl, -fsS, -X, POST, http://lb.internal/hosts/gpu-01/drain]`), so that the gate's "
                          "figures carry no production request: as Kamal's hooks, but run by the host's supervisor "
                          "(in its container: the pipeline image, host network), so it outlives the driver. A hook "
                          "that fails or passes `serving.hook_timeout_s` stops the job before any restart. Holds no "
                          "secret (argv is logged).",
    )
    undrain_hook: list[str] | None = Field(
        None, description="Argv run when a speculate job that ran `drain_hook` ends, whatever happened, after serving "
                          "is on the decided release (e.g. the load balancer's undrain call); its failure is "
                          "recorded in the result and the audit line.",
    )
    hook_timeout_s: float = Field(60.0, gt=0, description="Longest `drain_hook` / `undrain_hook` may run, in "
                                                          "seconds; it is killed then.")
    gate_ttft_ratio_max: float = Field(
        1.5, gt=0, description="Most median time to first token of the speculative release over the baseline's at "
                               "production concurrency; above it the gate rolls back whatever the throughput.",
    )

    @field_validator("cpuset_cpus", mode="before")
    @classmethod
    def _cpuset_number(cls, v: Any) -> Any:
        """``cpuset_cpus: 1`` in YAML is a number: the one CPU it names."""
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("gate_margin")
    @classmethod
    def _margin(cls, v: float) -> float:
        return check_gate_margin(v)
    acceptance_floor: float = Field(
        1.3, ge=1.0, description="Least mean acceptance length (1 + accepted / drafts, measured from vLLM's "
                                 "/metrics) of a kept speculative release; also the least offline estimate of the "
                                 "train manifest that `speculate` accepts without --force.",
    )
    gate_prompts: int = Field(16, ge=1, description="HumanEval gate-split prompts replayed per concurrency level.")
    gate_max_tokens: int = Field(128, ge=2, description="Output tokens per gate request (`ignore_eos`: exact).")
    regenerate_concurrency: int = Field(
        4, ge=1, description="`eagle3ops regenerate`: chat requests in flight at most against production serving "
                             "while it answers the training prompts (small, so production keeps its latency).",
    )
    regenerate_max_tokens: int = Field(
        512, ge=1, description="`eagle3ops regenerate`: output tokens at most per regenerated answer.",
    )
    regenerate_timeout_s: float = Field(
        300.0, gt=0, description="`eagle3ops regenerate`: seconds per chat request (a timeout is retried, "
                                 "3 attempts in all).",
    )
    speculative_image: str | None = Field(
        None, description="Serving image of the speculative release (vLLM with the serving patch series, e.g. "
                          "from `eagle3ops image build serving`); pushed when the host lacks it. Default: `image`.",
    )

    watch: WatchPolicy = Field(
        default_factory=WatchPolicy,
        description="`eagle3ops watch HOST`: the policy that judges the live release from /metrics over time "
                    "(see WatchPolicy).")

    @field_validator("gate_concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v) or len(set(v)) != len(v):
            raise ValueError("gate_concurrency: distinct positive request counts, production concurrency first, "
                             "e.g. [1, 8]")
        return v

    @property
    def managed(self) -> bool:
        """True when the host has production serving that windows stop, restore and health-gate (kind not
        ``none``)."""
        return KIND_KEYS[self.kind].managed

    @model_validator(mode="after")
    def _kind_fields(self) -> "ServingConfig":
        KIND_KEYS[self.kind].validate(self)
        return self

    @model_validator(mode="after")
    def _live_gate(self) -> "ServingConfig":
        if self.gate_traffic != "live":
            return self
        if self.gate_design != "aba":
            raise ValueError("`gate_traffic: live` needs `gate_design: aba`: only the baseline measured before and "
                             "after the speculative release shows whether the clients' load changed meanwhile; set "
                             "`gate_design: aba` or `gate_traffic: idle`")
        if self.drain_hook or self.undrain_hook:
            raise ValueError("`gate_traffic: live` measures beside the clients, `drain_hook`/`undrain_hook` take them "
                             "off production for the whole gate: remove the hooks or set `gate_traffic: idle`")
        return self


def _compose_name(s: ServingConfig) -> None:
    """The name Compose gives the service's first container must be one Docker takes."""
    try:
        container_name(f"{s.compose_project}-{s.compose_service}-1")
    except ValueError as exc:
        raise ValueError(f"`compose_project`/`compose_service`: {exc}") from None


def _unit_name(s: ServingConfig) -> None:
    """``unit`` must be a systemd unit name (``systemctl`` takes it as one argument)."""
    if not re.fullmatch(r"[A-Za-z0-9:_.@-]+", s.unit or ""):
        raise ValueError(f"`unit` {s.unit!r} is not a systemd unit name (letters, digits and `:_.@-`, e.g. "
                         f"`vllm.service`)")


def _cpuset_fits(s: ServingConfig, keys: "KindKeys") -> None:
    """``cpuset_cpus`` only on a serving container, and vLLM's explicit OpenMP binding inside it.

    vLLM 0.16 CPU (``vllm/v1/worker/cpu_worker.py``, ``init_device``): ``VLLM_CPU_OMP_THREADS_BIND`` is ``auto``
    (the default: the CPUs of ``sched_getaffinity``, i.e. the container's set), ``nobind``, or one CPU list per
    rank joined by ``|``; a listed CPU outside the container's set cannot be bound.
    """
    if not keys.in_container:
        raise ValueError(f"`cpuset_cpus` pins a serving container (kind container or compose), not kind "
                         f"`{keys.name}`: remove it and {keys.pin_cpus or 'pin the server where it is started'}")
    allowed = cpu_ids(s.cpuset_cpus or "")
    bind = s.env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if bind in ("auto", "nobind", ""):
        return
    for rank in bind.split("|"):
        try:
            outside = sorted(cpu_ids(rank) - allowed)
        except ValueError:
            continue  # not a CPU list: vLLM's own error at start names it
        if outside:
            raise ValueError(f"`env.VLLM_CPU_OMP_THREADS_BIND` {bind!r} binds vLLM's threads to CPUs "
                             f"{','.join(map(str, outside))}, outside `cpuset_cpus` {s.cpuset_cpus!r}: name CPUs of "
                             f"the set, or remove it (its default, `auto`, binds to the container's CPUs)")


#: Serving keys that belong to one kind only (key → the kind that takes it).
KIND_ONLY_KEYS = {"compose_project": "compose", "compose_service": "compose", "process_match": "process",
                  "unit": "systemd"}


@dataclass(frozen=True)
class KindKeys:
    """What one serving kind asks of the `serving:` keys: the keys it needs, whether windows manage it, and any
    check of its own. The configuration's view of a kind (the supervisor's and the driver's are
    :mod:`eagle3ops.supervisor.kinds` and :mod:`eagle3ops.window.kinds`)."""

    #: The ``serving.kind`` value.
    name: str
    #: Keys that must be set (not None, not empty) for this kind.
    needs: tuple[str, ...] = ()
    #: False: a host without production serving (no other serving key is allowed).
    managed: bool = True
    #: A check of its own on the validated keys; raises ValueError with the fix.
    extra: Callable[[ServingConfig], None] | None = None
    #: True: serving is a container, so the host needs an engine (refused with ``stage_runtime: venv``).
    in_container: bool = False
    #: How to pin this kind's server to CPUs, for a kind that ``cpuset_cpus`` (a container's) cannot pin.
    pin_cpus: str = ""

    def validate(self, s: ServingConfig) -> None:
        """Check ``s`` against this kind.

        Raises:
            ValueError: a needed key missing, another kind's key set, or the kind's own check failing; the message
                names the key and the fix (pydantic wraps it with the file and ``hosts.NAME.serving``).
        """
        if not self.managed:
            extra = sorted(s.model_fields_set - {"kind"})
            if extra:
                raise ValueError(f"`kind: {self.name}` (a host without production serving) takes no other serving "
                                 f"keys, got {extra}: remove them, or set the kind of the host's serving")
            return
        missing = [k for k in self.needs if getattr(s, k) in (None, "")]
        if missing:
            raise ValueError(f"kind `{self.name}` needs {' and '.join(f'`{k}`' for k in missing)} (add "
                             f"{'them' if len(missing) > 1 else 'it'}; or `serving: none` for a host that only "
                             f"trains)")
        foreign = sorted(k for k, kind in KIND_ONLY_KEYS.items() if kind != self.name and getattr(s, k) is not None)
        if foreign:
            owner = KIND_ONLY_KEYS[foreign[0]]
            foreign = [k for k in foreign if KIND_ONLY_KEYS[k] == owner]
            keys = "/".join(f"`{k}`" for k in foreign)
            raise ValueError(f"{keys} {'are' if len(foreign) > 1 else 'is'} set but `kind` is not `{owner}` (it is "
                             f"`{self.name}`): set `kind: {owner}` or remove {'them' if len(foreign) > 1 else 'it'}")
        if s.cpuset_cpus is not None:
            _cpuset_fits(s, self)
        if self.extra is not None:
            self.extra(s)


#: Every serving kind's configuration rules, by ``serving.kind`` (one entry per kind; a new kind adds one).
KIND_KEYS: dict[str, KindKeys] = {k.name: k for k in (
    KindKeys("container", needs=("image", "served_model_name"), in_container=True),
    KindKeys("compose", needs=("image", "served_model_name", "compose_project", "compose_service"),
             extra=_compose_name, in_container=True),
    KindKeys("process", needs=("served_model_name", "process_match"),
             pin_cpus="start the server under `taskset -c CPUS`"),
    KindKeys("systemd", needs=("served_model_name", "unit"), extra=_unit_name,
             pin_cpus="set `CPUAffinity=` in the unit"),
    KindKeys("none", managed=False),
)}
assert set(KIND_KEYS) == set(SERVING_KINDS)


#: ``stage_runtime`` value of a host without a container engine: supervisor and stages run as processes.
VENV_RUNTIME = "venv"


class HostConfig(StrictModel):
    """One host of the inventory: how to reach it over SSH, its Docker endpoint, data and serving."""

    name: str = Field(..., description="Inventory name of the host (the key under `hosts:`).")
    hostname: str = Field(..., description="SSH host: an alias from ~/.ssh/config (ProxyJump works) or an address.")
    user: str | None = Field(None, description="SSH user; default from ssh_config or the local user.")
    port: int | None = Field(None, ge=1, le=65535, description="SSH port; default from ssh_config or 22.")
    identity_file: Path | None = Field(None, description="SSH private key; default from ssh_config / agent.")
    known_hosts: Path | None = Field(
        None, description="Extra known_hosts file checked in addition to ~/.ssh/known_hosts (never skipped)."
    )
    ssh_config: Path | None = Field(None, description="ssh_config file to read host aliases from.")
    connect_timeout_s: int | None = Field(
        None, ge=1, le=600, description="Seconds each SSH hop may take for its TCP connect, then its SSH banner, then "
        "authentication (each phase); a host that does not answer fails once within them. Default 20."
    )
    docker_host: str | None = Field(
        None, description="Docker endpoint on the host, e.g. `unix:///run/user/1000/docker.sock`; default socket."
    )
    gpus: int = Field(0, ge=0, description="GPUs on the host; 0 = CPU only (the sandbox).")
    cpus: int | None = Field(None, ge=1, description="CPU cores a scheduler task on the host may use (`render slurm`'s "
                             "--cpus-per-task, `render k8s`'s cpu requests and limits); required by `render`.")
    data_dir: str = Field(..., description="Directory on the host for models, datasets and run outputs.")
    state_dir: str = Field(
        ..., description="Directory on the host for eagle3ops state: lock, journal, releases, audit log."
    )
    model_path: str = Field(..., description="Target model directory on the host (inside or outside data_dir).")
    serving: ServingConfig = Field(..., description="Production serving on this host (the vLLM container a window "
                                   "stops and restores), or `none` for a host that only trains.")
    pipeline_image: str | None = Field(
        None, description="Pipeline image to run stages with; default: the image `eagle3ops image build` made."
    )
    profile: str | None = Field(
        None, description="The stack profile this host runs, a name of patches/profiles.yaml (e.g. "
        "`speculators-0.9.0-vllm-0.32.0`): `deploy` builds its pipeline image for it (`--profile` overrides) and a "
        "window refuses to start when live serving's `/version` is not the profile's vLLM version; default: the "
        "registry's default profile (vLLM 0.16.0). Compatibility matrix: docs/vllm-profiles.md."
    )
    stage_env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Extra environment for stage containers, e.g. NCCL_PROTO, NCCL_ALGO."
    )
    secret_env: list[SecretEnvName] = Field(default_factory=list, description="Names of environment variables "
        "holding secrets beyond `VLLM_API_KEY`, `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN` (and `--api-key`, `--hf-token`), "
        "e.g. `[ORG_SERVING_TOKEN]`: `***` in every journal, result, audit, log, report, config check and dry run.")
    maintenance_budget_s: float = Field(
        7200.0, gt=0, description="Longest a window may keep serving down, in seconds: stages, restore, health gate "
        "and rollbacks together. The restore's share, min(serving.health_timeout_s, budget / 2), is reserved: stages "
        "must end by the budget minus that share. A gate still gets up to 120 s past a spent budget to bring serving "
        "back (recorded as a warning): serving comes before the budget."
    )
    stage_runtime: str | None = Field(
        None, description="Docker runtime of stage containers (`docker run --runtime`), e.g. `nvidia` on hosts "
        "whose engine has no CDI/`--gpus` support; default: the engine's default runtime. Preflight starts a "
        "throwaway container with it before serving stops. The value `venv` means no container engine at all "
        "(e.g. a rented GPU container reached over SSH): the supervisor and the stages run as processes "
        "of the pipeline environment unpacked under `state_dir/env/`, built against `venv_python`; serving must "
        "then be `process`, `systemd` or `none`."
    )
    venv_python: str | None = Field(
        None, description="With `stage_runtime: venv`: the host's Python interpreter the pipeline environment is "
        "built against (absolute path, e.g. `/usr/bin/python3.12`); the user's own venvs are never used or changed. "
        "Required with `stage_runtime: venv`, refused without it."
    )
    stage_ipc: str | None = Field(
        None, description="IPC mode of stage containers (`--ipc`); default `host` on GPU hosts (NCCL), none on CPU "
        "hosts."
    )
    stage_shm_size: str | None = Field(
        None, description="`/dev/shm` size of stage containers (`--shm-size`, e.g. `16g`); default: the engine's."
    )
    stage_ulimits: dict[str, int | str] | None = Field(
        None, description="Ulimits of stage containers, name → `soft:hard` (or one value for both; -1 = "
        "unlimited), e.g. `{memlock: \"-1\", stack: \"67108864\"}`; default `{memlock: \"-1\"}` on GPU hosts "
        "(NCCL), none on CPU hosts. A hard limit above the host's own is refused by the engine: preflight says so "
        "before serving stops."
    )
    stage_timeout_s: float = Field(3600.0, gt=0, description="Longest one stage may run, in seconds.")
    min_free_gib: float = Field(1.0, ge=0, description="Free space required on data_dir beyond stage estimates.")

    @property
    def uses_venv(self) -> bool:
        """True for a host without a container engine (``stage_runtime: venv``, :data:`VENV_RUNTIME`)."""
        return self.stage_runtime == VENV_RUNTIME

    @model_validator(mode="after")
    def _venv_runtime(self) -> "HostConfig":
        """``stage_runtime: venv`` needs ``venv_python`` and serving without containers; container-only stage
        settings are refused with it (they would be silently ignored)."""
        if not self.uses_venv and self.venv_python is not None:
            raise ValueError(f"venv_python is set but stage_runtime is {self.stage_runtime!r}: venv_python is used "
                             f"only with `stage_runtime: venv` (remove it, or set stage_runtime: venv)")
        if not self.uses_venv:
            return self
        if not (self.venv_python or "").startswith("/") or any(c.isspace() for c in self.venv_python or ""):
            raise ValueError(f"stage_runtime: venv needs venv_python, the host's Python the pipeline environment is "
                             f"built against, as an absolute path (e.g. /usr/bin/python3.12); got {self.venv_python!r}")
        if KIND_KEYS[self.serving.kind].in_container:
            raise ValueError(f"stage_runtime: venv is for hosts without a container engine, but serving.kind is "
                             f"{self.serving.kind!r} (a container): set serving.kind to `process`, `systemd` or `none`")
        extra = [k for k in ("stage_ipc", "stage_shm_size", "stage_ulimits", "docker_host") if getattr(self, k)]
        if extra:
            raise ValueError(f"{', '.join(extra)}: container settings, not used with stage_runtime: venv (stages run "
                             f"as processes with the host's own limits and IPC): remove them")
        return self

    @field_validator("stage_ulimits")
    @classmethod
    def _ulimits(cls, value: dict[str, int | str] | None) -> dict[str, int | str] | None:
        for name, v in (value or {}).items():
            parts = str(v).split(":")
            if len(parts) > 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
                raise ValueError(f"{name}: {v!r} is not an integer or `soft:hard` of integers (-1 = unlimited), "
                                 f"e.g. `memlock: \"-1\"` or `stack: \"67108864:67108864\"`")
        return value

    @field_validator("serving", mode="before")
    @classmethod
    def _serving_none(cls, value: Any) -> Any:
        """``serving: none`` is shorthand for ``serving: {kind: none}``."""
        if value == "none":
            return {"kind": "none"}
        if isinstance(value, str):
            raise ValueError(f"expected a mapping of serving settings (image:, served_model_name:, ...) or `none` "
                             f"for a host that only trains, got {value!r}")
        return value

    @field_validator("data_dir", "state_dir", "model_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path on the host, got {value!r}")
        return host_path(value.rstrip("/") or "/")  # each is bind-mounted into stage or supervisor containers

    @field_validator("docker_host")
    @classmethod
    def _socket(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("unix://"):
            host_path(value.removeprefix("unix://"))  # the socket is bind-mounted into the supervisor
        return value


class Inventory(StrictModel):
    """The whole inventory file: a mapping of host name → :class:`HostConfig`, and the fleet settings."""

    hosts: dict[str, HostConfig] = Field(..., description="Host name → its settings; the name is what commands "
                                         "take as HOST (`make extract HOST=gpu-01`).")
    fleet: FleetConfig = Field(default_factory=FleetConfig, description="Runs over several hosts: down-at-once "
                               "policy, window splitting, rendezvous, scheduler rendering.")
    groups: dict[str, GroupConfig] = Field(default_factory=dict, description="Group name → serving hosts behind one "
                                           "load balancer, released host by host (docs/serving-groups.md).")
    source: Path | None = Field(None, exclude=True, description="File the inventory was read from.")

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: dict[str, GroupConfig], info: Any) -> dict[str, GroupConfig]:
        if "hosts" in info.data:  # else the hosts' own errors are reported
            check_groups(value, info.data["hosts"])
        return value

    def host(self, name: str) -> HostConfig:
        """Return the host called ``name``.

        Raises:
            ConfigError: no such host; the message lists the known names.
        """
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "(none)"
            raise ConfigError(f"{self.source or 'inventory'}: no host {name!r}. Known hosts: {known}. "
                              f"Add it under `hosts:` or pass HOST=<one of them>.") from None


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, where: str) -> Any:
    """Expand ``${NAME}`` and ``${NAME:-default}`` in every string of a parsed host entry (after YAML parsing,
    so a variable's value can never change the document's structure), as Docker Compose does.

    Used by the sandbox entry so that several sandboxes (own name, ports, state) run side by side on one machine.

    Raises:
        ConfigError: ``${NAME}`` without a default names a variable that is not set (names key and variable).
    """
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ and os.environ[name] != "":
            return os.environ[name]
        if default is None:
            raise ConfigError(f"{where}: environment variable {name} is not set; set it or write ${{{name}:-default}}")
        return default

    return _ENV_REF.sub(sub, value)


def _resolve_paths(raw_host: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(raw_host)
    for key in ("identity_file", "known_hosts", "ssh_config"):
        value = out.get(key)
        if isinstance(value, str):
            p = Path(os.path.expanduser(value))
            out[key] = p if p.is_absolute() else (base / p).resolve()
    return out


def load_inventory(path: Path | str = DEFAULT_INVENTORY) -> Inventory:
    """Read and validate an inventory file.

    Local paths in a host entry (``identity_file``, ``known_hosts``, ``ssh_config``) are resolved relative to the
    inventory file's directory; ``~`` is expanded.

    Raises:
        ConfigError: the file is missing, not YAML, not a mapping with ``hosts:``, or fails validation; the
            message names the file, each bad key and the fix.
    """
    path = Path(path)
    raw = read_yaml(path, what="inventory file", missing_fix="pass --inventory FILE or create it; example: "
                    "deploy/hosts.yaml")
    raw = require_mapping(raw, path, what="inventory", expected="`hosts:`, a mapping of host name → settings")
    if not isinstance(raw.get("hosts"), dict):
        raise ConfigError(f"{path}: expected a `hosts:` mapping of host name → settings (example: deploy/hosts.yaml)")
    unknown = set(raw) - {"hosts", "fleet", "groups"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}; only `hosts:`, `fleet:` and `groups:` "
                          "are allowed (put them under a host, or remove them)")
    hosts: dict[str, Any] = {}
    for name, entry in raw["hosts"].items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: hosts.{name} must be a mapping of settings (hostname:, data_dir:, ...)")
        entry = _resolve_paths(_expand_env(entry, f"{path}: hosts.{name}"), path.parent)
        entry.setdefault("name", name)
        hosts[name] = entry
    top = {"hosts": hosts, **{k: raw[k] for k in ("fleet", "groups") if raw.get(k) is not None}}
    inv = validate(Inventory, top, path, what="inventory", section=SECTION)
    return inv.model_copy(update={"source": path})


__all__ = [
    "ConfigError",
    "DEFAULT_INVENTORY",
    "FleetConfig",
    "GroupConfig",
    "HostConfig",
    "Inventory",
    "ServingConfig",
    "WatchPolicy",
    "load_inventory",
]
