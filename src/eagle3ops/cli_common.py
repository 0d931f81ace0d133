"""What the ``eagle3ops`` command modules share: the stderr console, the ``--inventory`` and ``--dry-run`` options,
and loading a host, opening a :class:`eagle3ops.remote.Remote` to it and failing with a message.

Command modules call these through the module (``common.remote(...)``), never by a name imported from it, so a test
that replaces one (``monkeypatch.setattr(cli_common, "remote", ...)``) replaces it for every command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from eagle3ops.config import ConfigError, HostConfig, load_inventory

__all__ = ["DryRunOpt", "HOST_CHANGING", "InventoryOpt", "JsonOpt", "changes_a_host", "console", "fail", "load_host",
           "plan_output", "print_plan", "remote"]

console = Console(stderr=True)

InventoryOpt = typer.Option(
    Path(os.environ.get("EAGLE3OPS_INVENTORY", "deploy/hosts.yaml")), "--inventory", "-i",
    help="Inventory file (env EAGLE3OPS_INVENTORY).")
DryRunOpt = typer.Option(False, "--dry-run", help="Print every remote command in order; execute none.")
JsonOpt = typer.Option(False, "--json", help="With --dry-run: print the plan as one JSON document on stdout (the "
                       "commands go to stderr).")

#: Commands that change a host (or would have): a run that never reached its host is recorded in the local audit log.
HOST_CHANGING = {"deploy", "extract", "train", "release", "rollback", "speculate", "recover", "attach", "push",
                 "probe", "verify", "watch", "weights", "cycle"}


def changes_a_host(args: list[str]) -> bool:
    """Whether the command line ``args`` (without the program name) is a host-changing command (not a dry run)."""
    words = [a for a in args if not a.startswith("-")]
    return "--dry-run" not in args and bool(words) and (
        words[0] in HOST_CHANGING or words[:2] == ["lock", "release"]
        or (words[0] == "group" and words[1:2] != ["status"]))


def load_host(inventory: Path, name: str) -> HostConfig:
    """Host ``name`` of the inventory file ``inventory``; a bad inventory or an unknown host prints the error and
    exits with status 2 (``typer.Exit``)."""
    try:
        return load_inventory(inventory).host(name)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def remote(host: HostConfig, dry_run: bool = False, json_out: bool = False):
    """The SSH executor to ``host`` (:func:`eagle3ops.executor.for_host`: not yet connected; use it as a context
    manager); a dry run echoes every command it would run to stdout (``json_out``: to stderr, stdout keeping the plan
    for :func:`print_plan`), its secrets masked (:mod:`eagle3ops.redact`). ``json_out`` without ``dry_run`` is a
    usage error (exit 2): a real run's result is printed by the command itself."""
    from eagle3ops import executor, redact

    if json_out and not dry_run:
        fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)
    out = sys.stderr if json_out else sys.stdout
    echo = (lambda cmd: print(redact.text(cmd, host.secret_env), file=out)) if dry_run else None
    return executor.for_host(host, dry_run=dry_run, echo=echo)


def print_plan(plan: dict[str, Any], host: HostConfig, json_out: bool) -> None:
    """``--dry-run --json``: the dry run's plan (a JSON-ready value: a window's plan and commands, a copy's steps)
    printed on stdout as one JSON document, its secrets masked (:func:`eagle3ops.redact.value`, with the host's
    ``secret_env``); nothing without ``json_out``."""
    from eagle3ops import redact

    if json_out:
        print(json.dumps(redact.value(plan, host.secret_env), indent=2, sort_keys=True, default=str), flush=True)


def plan_output(dry_run: bool, json_out: bool):
    """A context in which a command prints its dry run: with ``json_out`` (``--dry-run --json``) what it prints on
    stdout goes to stderr, so that stdout holds the plan alone (:func:`print_plan`, after the block); else nothing
    changes. ``json_out`` without ``dry_run`` is a usage error (exit 2), as in :func:`remote`."""
    import contextlib

    if json_out and not dry_run:
        fail("--json prints the plan of a dry run: add --dry-run, or drop --json", 2)
    return contextlib.redirect_stdout(sys.stderr) if json_out else contextlib.nullcontext()


def fail(msg: str, code: int = 1) -> NoReturn:
    """Print ``error: msg`` on stderr and exit with status ``code`` (``typer.Exit``)."""
    console.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


def int_list(text: str, option: str, example: str) -> list[int]:
    """A comma-separated list of integers (``--k 2,3``); a usage error (exit 2) naming ``option`` otherwise, also
    for an empty item (``2,``)."""
    words = [x.strip() for x in text.split(",")] if text.strip() else []
    try:
        if any(not w for w in words):
            raise ValueError
        return [int(w) for w in words]
    except ValueError:
        fail(f"{option} {text!r}: comma-separated integers, e.g. {option} {example}", code=2)


def env_pairs(pairs: list[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` words of a repeatable option as a dict, each checked as the inventory checks an environment
    entry (:func:`eagle3ops.config.enginevalues.env_name`, :func:`~eagle3ops.config.enginevalues.env_value`).

    Raises:
        typer.Exit: (status 2, through :func:`fail`) a word without ``=``, or a bad name or value; the message
            names the option and the fix (the value itself is not shown: it may be a secret).
    """
    from eagle3ops.config.enginevalues import env_name, env_value

    out: dict[str, str] = {}
    for p in pairs:
        name, eq, value = p.partition("=")
        try:
            if not eq:
                raise ValueError("not NAME=VALUE")
            out[env_name(name)] = env_value(value)
        except ValueError as e:
            fail(f"{option} {name}{'=...' if eq else ''}: {e} (write {option} NAME=VALUE, e.g. {option} "
                 "NCCL_ALGO=Ring)", code=2)
    return out


def deployed_record(r, required: bool = True) -> dict[str, Any]:
    """The host's ``deployed.json`` (image tag and id, read over the executor ``r``); a placeholder in dry runs of a
    never-deployed host.

    Raises:
        typer.Exit: (through :func:`fail`) nothing is deployed and ``required``; the message names ``deploy``.
    """
    import json

    from eagle3ops.commands import host as hc
    from eagle3ops.window.common import paths

    out = r.run(hc.cat_if_exists(paths(r.host)["deployed"]), check=False)
    if out.stdout.strip():
        return json.loads(out.stdout)
    if required:
        from eagle3ops.window.common import hint

        fail(f"{r.host.name}: no pipeline image deployed yet; run {hint('deploy', r.host.name)} first")
    return {"image": r.host.pipeline_image or "<pipeline image from `eagle3ops deploy`>", "image_id": None}


def read_pipeline(pipeline: Path) -> str:
    """The pipeline config's text, validated here; the window writes it to the host under the lock, after
    preflight (never before: a run refused by the lock must not change a running window's input).

    Raises:
        typer.Exit: (through :func:`fail`) the file is missing or invalid; the message names it.
    """
    if not pipeline.is_file():
        fail(f"{pipeline}: pipeline config not found (pass --pipeline FILE)")
    text = pipeline.read_text()
    from eagle3ops.config.pipeline import PipelineConfigError, parse_pipeline_config

    try:
        parse_pipeline_config(text, pipeline)
    except PipelineConfigError as exc:
        fail(f"invalid pipeline config: {exc}")
    return text


def command_line() -> str:
    """This invocation as a shell command line (each argument quoted: the lock and the audit log show it, and it
    may be pasted back into a shell), with every secret (:mod:`eagle3ops.redact`) and every `--env` value shown as
    `***`."""
    import shlex
    import sys

    from eagle3ops import redact

    # Secrets (also given through --arg: `--arg --api-key --arg K`) and every --env value (any may be a secret)
    # never reach the lock or the audit; the rest is the one redaction rule's.
    words, pending = [], None  # pending: the next value word is hidden ("env": its value part)
    for a in sys.argv[1:]:
        if pending == "env" and "=" in a:
            a, pending = a.split("=", 1)[0] + "=" + redact.MASK, None
        elif pending == "key" and a != "--arg":
            a, pending = redact.MASK, None
        elif a.startswith("--env="):
            a = "--env=" + a[6:].split("=", 1)[0] + "=" + redact.MASK
        else:
            a = redact.text(a)  # --api-key=K, NAME=K, or a key inside one word holding a command line
        pending = "env" if a == "--env" else "key" if redact.is_secret_flag(a) else (
            pending if a == "--arg" else None)
        words.append(a)
    return shlex.join(["eagle3ops", *words])
