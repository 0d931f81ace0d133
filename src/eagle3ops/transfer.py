"""Placeholder; its owner replaces it (see the ownership map)."""


def push_command() -> None:
    """Push an image to hosts (not yet implemented)."""
    raise SystemExit("eagle3ops push: not implemented yet")
