#!/usr/bin/env bash
# README's test command (`make test`, after setup and prebuild): three runs side by side on this machine, each to
# its end whatever the others do:
#   - the host suite's sandbox part (`--part sandbox`: every test that reaches the sandbox host, one at a time; its
#     output is printed as it runs),
#   - the host suite's other part (`--part rest`: pure tests, the build engine, modules with sandboxes of their own;
#     output in .cache/test-rest.log, printed after),
#   - the in-image suite (scripts/test-image.sh; output in .cache/test-image.log, printed after).
# tests/conftest.py says which test is in which part. The exit status is non-zero when any of the three failed.
# Usage: scripts/test.sh PIPELINE_IMAGE_TAG [pytest args for both host parts...]
set -uo pipefail
cd "$(dirname "$0")/.."
tag=$1; shift
mkdir -p .cache
t0=$(date +%s)
bash scripts/test-image.sh "$tag" > .cache/test-image.log 2>&1 &
image_pid=$!
.venv/bin/python -m pytest -ra --durations=10 --part rest "$@" tests --ignore=tests/image > .cache/test-rest.log 2>&1 &
rest_pid=$!
.venv/bin/python -m pytest -ra --durations=10 --part sandbox "$@" tests --ignore=tests/image
sandbox_rc=$?
t_sandbox=$(( $(date +%s) - t0 ))
wait "$rest_pid"; rest_rc=$?
wait "$image_pid"; image_rc=$?
echo "==================== host suite, part rest (exit $rest_rc) ===================="
cat .cache/test-rest.log
echo "==================== in-image suite (scripts/test-image.sh $tag; exit $image_rc) ===================="
cat .cache/test-image.log
echo "sandbox part: exit $sandbox_rc ($t_sandbox s); rest part: exit $rest_rc; in-image suite: exit $image_rc;" \
     "all three took $(( $(date +%s) - t0 )) s"
[ "$sandbox_rc" = 0 ] && [ "$rest_rc" = 0 ] && [ "$image_rc" = 0 ]
