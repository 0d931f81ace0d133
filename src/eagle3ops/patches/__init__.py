"""Patch series for upstream packages: checked-in, pinned, strictly applied, behaviourally probed.

Modules (one job each): :mod:`.series` parses series/upstream.yaml/DEP-3 headers/profiles.yaml;
:mod:`.diffcheck` validates a diff's paths before anything is touched; :mod:`.gnupatch` runs GNU patch strictly;
:mod:`.installed` finds installed distributions and checks pins; :mod:`.apply` applies a series and writes the
manifest; :mod:`.proberun` verifies the applied files' hashes and runs the probes (:mod:`.probes`, owned by the
series author); :mod:`.wheels` fetches and unpacks pinned wheels; :mod:`.check` checks every series against its
wheel; :mod:`.workspace` is ``new``/``refresh``;
:mod:`.rebase` carries a series to a new version; :mod:`.record` and :mod:`.capture` compare a container's package
with its wheel (``capture``/``drift``); :mod:`.cli` is the ``eagle3ops patch`` command line.
"""
