"""``python -m eagle3ops.patches ...`` runs the patch CLI alone (same as ``eagle3ops patch ...``)."""

from eagle3ops.patches.cli import main

if __name__ == "__main__":
    main()
