"""``eagle3ops image``: build pipeline/serving images with content tags, list images (the stand-in bases are
built by the development harness: ``make base``).

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


@app.command("env-tarball")
def env_tarball(
    image: Annotated[str, typer.Argument(help="A built pipeline image on the local engine (tag or id).")],
    venv_python: Annotated[str, typer.Option("--venv-python", help="The venv host's interpreter (its inventory "
                                             "key venv_python, e.g. /usr/bin/python3.12): same Python minor "
                                             "version as the image's.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Also copy the tarball here (default: "
                                                   "only the cache).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Export the pipeline image's venv as the pipeline environment of venv hosts (`stage_runtime: venv`): a gzip
    tarball named by its sha256, cached per image id and --venv-python; deliver it with `eagle3ops deploy HOST
    --env-tarball PATH` (or let deploy export it)."""
    import shutil

    from eagle3ops.transfer import envbuild

    try:
        env = envbuild.export_env(image, venv_python, echo=lambda m: typer.echo(m, err=True))
    except envbuild.EnvBuildError as exc:
        _fail(exc)
    path = env.path
    if output is not None:
        shutil.copyfile(env.path, output)
        path = output
    if json_out:
        typer.echo(json.dumps({"path": str(path), "image": env.image, "size": env.size, "python": env.python,
                               "source": env.source, "source_id": env.source_id, "build_s": env.build_s,
                               "cached": env.cached}))
    else:
        typer.echo(f"{env.image}  {path}  {env.size / 1e9:.2f} GB  Python {env.python}  from {env.source}"
                   + ("  (cached)" if env.cached else f"  {env.build_s:.0f} s"))
