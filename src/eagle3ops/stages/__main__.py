"""``python -m eagle3ops.stages NAME --run-dir DIR``: the stage sub-app alone (what torchrun's ranks run).

Same commands as ``python -m eagle3ops stage NAME``, without importing the driver's other sub-apps.
"""

from eagle3ops.stages.cli import app

if __name__ == "__main__":
    app(prog_name="python -m eagle3ops.stages")
