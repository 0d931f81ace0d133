"""A serving group's settings, read from a group file (``deploy/groups.yaml`` by default).

Until the inventory carries the groups itself, ``eagle3ops group ...`` reads them from this file; every host a group
names must be an inventory host. The file::

    groups:
      chat:
        hosts: [gpu-a, gpu-b, gpu-c]   # inventory host names, in rollout order (the first holds the journal)
        max_out: 1                     # hosts that may be out at once: drained, in maintenance or down
        balancer: {kind: haproxy, ...} # how the balancer is reached (its keys belong to the balancer's driver)
        bake_s: 600                    # the canary's bake on live traffic
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from eagle3ops.config.base import ConfigError, StrictModel, docs_hint, read_yaml, require_mapping, validate

__all__ = ["BalancerRef", "DEFAULT_GROUPS", "GroupConfig", "load_group"]

DEFAULT_GROUPS = Path("deploy/groups.yaml")


class BalancerRef(StrictModel):
    """How the group's load balancer is reached: ``kind`` names the balancer's driver; its other keys (socket,
    backend, ...) are that driver's own and are passed to it as they are."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str = Field(description="The balancer's driver, e.g. `haproxy`.")


class GroupConfig(StrictModel):
    """One serving group: its hosts (inventory names, in rollout order), how many may be out at once, its balancer and
    the rollout's timings (seconds)."""

    hosts: list[str] = Field(min_length=2, description="Inventory host names, in rollout order; the first holds the "
                                                       "rollout journal and the group lock under its state_dir.")
    max_out: int = Field(1, ge=1, description="Hosts that may be out at once (drained, in maintenance, or down by the "
                                              "balancer's own health check); less than the number of hosts.")
    balancer: BalancerRef
    bake_s: float = Field(600.0, ge=0, description="Seconds the kept canary serves live traffic before the roll.")
    bake_interval_s: float = Field(60.0, ge=1, description="Seconds between two of the bake's /metrics readings.")
    bake_sustained_s: float = Field(0.0, ge=0, description="Seconds a breach of `watch`'s rules must last on the "
                                    "canary before the bake aborts (0: the first breaching reading with traffic).")
    out_wait_s: float = Field(600.0, ge=0, description="Longest wait for room under max_out before a drain fails.")

    @model_validator(mode="after")
    def _check(self) -> "GroupConfig":
        dup = sorted({h for h in self.hosts if self.hosts.count(h) > 1})
        if dup:
            raise ValueError(f"hosts {dup} listed twice: name each host once")
        if self.max_out >= len(self.hosts):
            raise ValueError(f"max_out {self.max_out} would let every one of the {len(self.hosts)} hosts be out at "
                             f"once: set it to at most {len(self.hosts) - 1}")
        return self


def load_group(path: Path | str, name: str, inventory_hosts: Any = None) -> GroupConfig:
    """Group ``name`` of the group file ``path``; ``inventory_hosts`` (a container of names), when given, must hold
    every host the group names.

    Raises:
        ConfigError: the file is missing or invalid (file and key named), the group is not in it, or a host is not
            in the inventory.
    """
    raw = require_mapping(read_yaml(path, what="group file", missing_fix="create it with a `groups:` mapping: see "
                                    "docs/serving-groups-rollout.md"), path, what="group file",
                          expected="a `groups:` mapping")
    groups = require_mapping(raw.get("groups"), path, what="group file", expected="a `groups:` mapping")
    extra = sorted(set(raw) - {"groups"})
    if extra:
        raise ConfigError(f"{path}: unknown top-level key(s) {extra}: the file holds only `groups:`")
    if name not in groups:
        raise ConfigError(f"{path}: no group `{name}` (groups: {sorted(groups) or 'none'}): add `groups.{name}`")
    try:
        group = validate(GroupConfig, groups[name], path, what="group file", section="groups",
                         prefix=("groups", name))
    except ConfigError as exc:  # the group file's reference is its page, not a `config docs` section
        raise ConfigError(str(exc).replace(docs_hint("groups"), "docs/serving-groups-rollout.md")) from None
    if inventory_hosts is not None:
        missing = [h for h in group.hosts if h not in inventory_hosts]
        if missing:
            raise ConfigError(f"{path}: key `groups.{name}.hosts`: {missing} not in the inventory: add them under "
                              f"`hosts:` there or fix the names")
    return group
