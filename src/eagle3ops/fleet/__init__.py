"""Runs over several hosts: contiguous shards, the fleet plan and its schedule, the merge of
per-host manifests, carrying a plan out (:mod:`eagle3ops.fleet.execute`: order and bounds, I/O through the caller's
functions), rendering for Kubernetes and Slurm. Pure apart from :mod:`eagle3ops.fleet.gather` (reads over SSH) and
:mod:`eagle3ops.fleet.driver` (the windows, through the single-host window machinery)."""
