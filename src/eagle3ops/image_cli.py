"""``eagle3ops image``: build pipeline/serving images with content tags, list images (the stand-in bases are
built by the development harness: ``python -m eagle3ops_dev base``).

Heavy work lives in :mod:`eagle3ops.images`; docker is imported lazily there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True, help="Versioned images: pipeline and serving builds, listing.")

CaOpt = Annotated[
    Optional[Path],
    typer.Option("--ca-bundle", help="CA bundle for a TLS-intercepting proxy, passed as a BuildKit secret (never in "
                 "a layer). Default: $EAGLE3OPS_CA_BUNDLE, else /etc/ssl/certs/ca-certificates.crt when present."),
]
NoCaOpt = Annotated[bool, typer.Option("--no-ca-bundle", help="Pass no CA bundle (direct internet access).")]


def _ca(ca_bundle: Optional[Path], no_ca: bool) -> Optional[Path]:
    from eagle3ops import images

    if no_ca:
        return None
    return ca_bundle or images.default_ca_bundle()


def _fail(exc: Exception) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    raise typer.Exit(1)


@app.command()
def build(
    name: Annotated[str, typer.Argument(help="Image definition: pipeline or serving (images/<name>.yaml).")] = "pipeline",
    base_image: Annotated[Optional[str], typer.Option("--base-image", help="Override the base (e.g. the local base).")] = None,
    profile: Annotated[Optional[str], typer.Option(
        help="Patch profile, a name from patches/profiles.yaml (default: the definition's default_profile, else the "
             "registry's default).")] = None,
    ca_bundle: CaOpt = None,
    no_ca_bundle: NoCaOpt = False,
    tag_only: Annotated[bool, typer.Option("--tag-only", help="Print the content tag without building.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    verify: Annotated[str, typer.Option(help="pipeline: 'probes' (each patch's probe runs, or its pass is reused "
                                             "when every input byte is identical), 'probes-fresh' (every probe "
                                             "runs) or 'apply-only' (fast dev rebuild, no probes anywhere); "
                                             "labelled io.eagle3ops.verify-mode.")] = "probes",
    engine_checks: Annotated[str, typer.Option(help="pipeline: where the checks that need a vLLM engine (the "
                                                    "probes) run: 'auto' (at build when the base can start an "
                                                    "engine, else on the host: `eagle3ops probe HOST`), 'build' or "
                                                    "'host'; labelled io.eagle3ops.verified.")] = "auto",
) -> None:
    """Build an image and tag it <name>:<vllm>-<speculators>-<12 hex> (hash of base, pins, lock, patches, files)."""
    from eagle3ops import images

    try:
        if tag_only:
            typer.echo(images.content_tag(name, profile, base_image, verify=verify, engine_checks=engine_checks))
            return
        built = images.build_image(name, base_image, profile, _ca(ca_bundle, no_ca_bundle), verify=verify,
                                   engine_checks=engine_checks)
    except images.ImageError as exc:
        _fail(exc)
    if json_out:
        typer.echo(json.dumps({"tag": built.tag, "image_id": built.image_id, "size": built.size,
                               "seconds": round(built.seconds, 1),
                               "verified": built.labels.get("io.eagle3ops.verified")}))
    else:
        typer.echo(f"{built.tag}  {built.image_id[:19]}  {images.human_size(built.size)}  {built.seconds:.1f}s  "
                   f"checks {built.labels.get('io.eagle3ops.verified', '-')}")


@app.command("ls")
def ls(
    host: Annotated[Optional[str], typer.Argument(help="Inventory host (default: the local engine).")] = None,
    inventory: Annotated[Optional[Path], typer.Option(help="Inventory file (for HOST).")] = None,
    all_images: Annotated[bool, typer.Option("--all", help="Also images without eagle3ops labels.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List images with their tags, sizes, profile and patches (local engine, or HOST over SSH)."""
    from rich.console import Console
    from rich.table import Table

    from eagle3ops import images

    runner = None
    remote = None
    host_cfg = None
    try:
        if host is not None:
            from eagle3ops.config import load_inventory
            from eagle3ops import executor

            inv = load_inventory(inventory) if inventory else load_inventory()
            host_cfg = inv.host(host)
            remote = executor.for_host(host_cfg)
            runner = lambda argv: remote.run(argv)  # noqa: E731
        rows = images.list_images(runner, all_images=all_images, host=host_cfg)
    except images.ImageError as exc:
        _fail(exc)
    except Exception as exc:  # noqa: BLE001 - a bad inventory or host name: one line naming the file and key
        from eagle3ops.config import ConfigError

        if not isinstance(exc, ConfigError):
            raise
        _fail(exc)
    finally:
        if remote is not None:
            remote.close()
    if json_out:
        typer.echo(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    table = Table(title=f"images on {host or 'local engine'}")
    for col in ("tag", "id", "size", "profile", "verified", "patches"):
        table.add_column(col)
    for r in rows:
        patches = "\n".join(f"{Path(k).name} {v[:12]}" for k, v in r.patches.items()) or "-"
        table.add_row("\n".join(r.tags) or "<none>", r.image_id.split(":")[-1][:12], images.human_size(r.size),
                      r.profile or "-", r.verified or "-", patches)
    Console().print(table)
