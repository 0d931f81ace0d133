"""Configuration of eagle3ops: every file a person writes, validated by one strict base and one error formatter.

One module per section (``eagle3ops config docs SECTION`` prints each from its models):

- :mod:`.inventory` — ``deploy/hosts.yaml``: hosts, SSH, Docker endpoint, serving (:func:`load_inventory`).
- :mod:`.pipeline` — ``<run_dir>/pipeline.yaml`` (example ``deploy/pipeline.yaml``): the stages of one run.
- :mod:`.images` — ``images/<name>.yaml``: image definitions, resolved against the profile registry.
- :mod:`.profiles` — ``patches/profiles.yaml``: the one registry of patch profiles.
- :mod:`.base` — the strict base model, :class:`ConfigError` and the one error formatter they all use.
- :mod:`.docs` — ``eagle3ops config docs [SECTION]``, generated from the models.

``plan``: the window plan the driver writes and the host-side supervisor reads.

The names most modules need (:func:`load_inventory`, :class:`HostConfig`, :class:`ConfigError`, ...) are
re-exported here, so ``from eagle3ops.config import load_inventory, HostConfig, ConfigError`` keeps working.
"""

from eagle3ops.config.base import ConfigError, StrictModel
from eagle3ops.config.inventory import DEFAULT_INVENTORY, HostConfig, Inventory, ServingConfig, load_inventory

__all__ = [
    "ConfigError",
    "DEFAULT_INVENTORY",
    "HostConfig",
    "Inventory",
    "ServingConfig",
    "StrictModel",
    "load_inventory",
]
