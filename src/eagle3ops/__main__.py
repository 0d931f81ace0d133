"""``python -m eagle3ops`` runs the CLI (used inside the pipeline image, where no console script is assumed)."""

from eagle3ops.cli import main

if __name__ == "__main__":
    main()
