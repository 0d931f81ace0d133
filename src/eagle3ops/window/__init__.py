"""A maintenance window, driver side: lock → preflight → launch the host-side supervisor → watch → summary.

The driver *plans and watches*; the host *does and remembers* (:mod:`eagle3ops.supervisor`). Nothing here stops
serving: the supervisor does, and it restores serving whatever happens to the driver. A preflight failure stops
nothing and releases the lock.

Modules: :mod:`.common` (errors, paths, hints, audit), :mod:`.lock`, :mod:`.preflight` (the disk estimate included),
:mod:`.estimate` (GPU memory per rank and CUDA architectures, pure), :mod:`.gpucheck` (preflight's GPU fit),
:mod:`.planner` (the plan, pure), :mod:`.offline` (facts from the inventory for ``--dry-run --offline``),
:mod:`.run` (a window end to end, relaunch), :mod:`.watch` (bounded, checks the supervisor is alive). The plan schema shared with the host side is :mod:`eagle3ops.config.plan`.
"""
