#!/usr/bin/env bash
# README's `make test` (after setup and prebuild): the two suites side by side on this machine, each to its end
# whatever the other does:
#   - stream 1: the host suite (real sshd + dockerd sandbox, one test at a time); its output is printed as it runs;
#   - stream 2: the in-image suite (scripts/test-image.sh: tests/image in a container of the pipeline image, on the
#     build engine); its output goes to .cache/test-image.log and is printed after stream 1 ends.
# Why side by side: the serial host suite leaves the CPUs idle half the time (measured 2026-12-02 on a warm disk,
# vmstat every 10 s: 53 % idle, 1 % iowait: one test at a time waits on SSH round trips, containers and polls), and
# the two suites share nothing but the build engine's image store (read-only here) and the CPUs. Measured warm
# (README): .ci/run 33:59 serial, 28:25 side by side. Not measured on a cold disk, where the host suite's two parts
# side by side had been slower (both streams waiting on the same first reads).
# The exit status is non-zero when either suite failed; both suites' ten slowest tests are printed.
# `make test-serial` runs the same two suites one after the other.
# Usage: scripts/test.sh PIPELINE_IMAGE_TAG [pytest args for the host suite...]
set -uo pipefail
cd "$(dirname "$0")/.."
tag=$1; shift
mkdir -p .cache
t0=$(date +%s)
(
  s=$(date +%s)
  bash scripts/test-image.sh "$tag" > .cache/test-image.log 2>&1
  irc=$?
  echo "in-image suite: exit $irc ($(( $(date +%s) - s )) s)" >> .cache/test-image.log
  exit "$irc"
) &
image_pid=$!
.venv/bin/python -m pytest -ra --durations=10 "$@" tests --ignore=tests/image
host_rc=$?
t_host=$(( $(date +%s) - t0 ))
wait "$image_pid"; image_rc=$?
echo "==================== in-image suite (scripts/test-image.sh $tag) ===================="
cat .cache/test-image.log
echo "host suite: exit $host_rc ($t_host s); in-image suite: exit $image_rc; both took $(( $(date +%s) - t0 )) s"
[ "$host_rc" = 0 ] && [ "$image_rc" = 0 ]
