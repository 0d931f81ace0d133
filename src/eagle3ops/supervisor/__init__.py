"""The host-side runner of a maintenance window: stop serving → stages → restore → health gate, with a journal.

It runs in a detached container on the host (started by :mod:`eagle3ops.window.run`), talks to the host's Docker
engine through its mounted socket (docker SDK) and outlives the driver's SSH session: if the operator's machine
sleeps or the driver is killed, stages finish (or hit the budget) and serving is restored anyway.

Files, all under ``<state_dir>`` on the host::

    lock/details.json             the deploy lock (released here at the end)
    windows/<id>/plan.json        what to do (written by the driver, mode 0600; :class:`eagle3ops.config.plan.Plan`)
    windows/<id>/journal.jsonl    one JSON object per step event: {"t", "step", "event", ...}, secrets masked
    windows/<id>/<stage>.log      each stage container's output
    windows/<id>/serving-inspect.json   the serving container's full ``docker inspect`` before it was stopped (0600)
    windows/<id>/result.json      the outcome (written last)
    releases/NNNN.json            retained serving releases (spec + image id, 0600); ``current`` names the live one
    audit.jsonl                   who, when, what, outcome — one line per window

Restarted after an interruption (Docker daemon restart, ``recover``), it reads the journal and goes on: finished
stages are not rerun, and serving is restored in every case.

Modules: :mod:`.runner` (the step table and its policy), :mod:`.stagerun` (stage containers), :mod:`.kinds` (the
serving kinds: container, compose, process, systemd, none), :mod:`.errors`, :mod:`.journal`, :mod:`.releases`,
:mod:`eagle3ops.health` (the one health gate, shared with the driver),
``__main__`` (entry point). The plan schema is :mod:`eagle3ops.config.plan`.
"""
