#!/usr/bin/env bash
# README's test command (`make test`, after setup and prebuild): the in-image suite (scripts/test-image.sh) runs in the
# background while the host suite runs on two pytest-xdist workers (the sandbox's tests on one of them, in turn:
# tests/conftest.py). Both always run to the end; the in-image suite's output is printed after the host suite's (it
# is also kept in .cache/test-image.log); the exit status is non-zero when either failed.
# Usage: scripts/test.sh PIPELINE_IMAGE_TAG [pytest args for the host suite...]
set -uo pipefail
cd "$(dirname "$0")/.."
tag=$1; shift
mkdir -p .cache
log=.cache/test-image.log
t0=$(date +%s)
bash scripts/test-image.sh "$tag" > "$log" 2>&1 &
image_pid=$!
.venv/bin/python -m pytest -ra --durations=10 -n 2 --dist loadgroup "$@" tests --ignore=tests/image
host_rc=$?
wait "$image_pid"
image_rc=$?
echo "==================== in-image suite (scripts/test-image.sh $tag; exit $image_rc) ===================="
cat "$log"
echo "host suite: exit $host_rc; in-image suite: exit $image_rc; both took $(( $(date +%s) - t0 )) s"
[ "$host_rc" = 0 ] && [ "$image_rc" = 0 ]
