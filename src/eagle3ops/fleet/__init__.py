"""Runs over several hosts (issues 29 and 30): contiguous shards, the fleet plan and its schedule, the merge of
per-host manifests, rendering for Kubernetes and Slurm. Pure apart from :mod:`eagle3ops.fleet.gather` (reads over
SSH)."""
