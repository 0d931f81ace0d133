"""Pure builders of remote commands: each function returns an argv list (or a spec dict) and does no I/O.

Modelled on Kamal's ``commands/``: the orchestration layer (:mod:`eagle3ops.window`) decides *when*, these modules
say *what*, and :mod:`eagle3ops.remote` runs them, quoting once. Tests read the argv directly; ``--dry-run``
prints them.
"""
