"""Placeholder sub-app; its owner replaces it (see the ownership map)."""

import typer

app = typer.Typer(no_args_is_help=True)
