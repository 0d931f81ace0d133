"""``python -m eagle3ops_dev demo | sandbox up|down|status | base``: see :mod:`eagle3ops_dev.cli`."""

from eagle3ops_dev.cli import main

if __name__ == "__main__":
    main()
