#!/usr/bin/env bash
# README's `make test` (after setup and prebuild): three streams side by side on this machine, each to its end
# whatever the others do:
#   - stream 1: the host suite's sandbox part (`pytest --part sandbox`: the tests that reach the inventory's sandbox
#     host, one at a time: one sshd, one engine, one serving port, one lock); its output is printed as it runs;
#   - stream 2: the host suite's rest part (`pytest --part rest`: pure tests and the modules that bring up sandboxes of
#     their own); its output goes to .cache/test-rest.log and is printed after stream 1 ends;
#   - stream 3: the in-image suite (scripts/test-image.sh: tests/image in a container of the pipeline image, on the
#     build engine); its output goes to .cache/test-image.log and is printed after stream 2's.
# Why side by side: one test at a time leaves the CPUs idle much of the time (it waits on SSH round trips, containers
# and polls: 53 % idle serially, 42 % idle with two streams, vmstat every 10 s on a warm disk), and the streams share
# nothing but the build engine's image store (read-only here) and the CPUs. The two host parts side by side were
# slower on a cold disk (both waiting on the same first reads); `make prebuild` reads every image first now.
# The exit status is non-zero when any stream failed; each stream's ten slowest tests are printed.
# `make test-serial` runs the whole host suite and then the in-image suite, one after the other.
# Usage: scripts/test.sh PIPELINE_IMAGE_TAG [pytest args for both host parts...]
set -uo pipefail
cd "$(dirname "$0")/.."
tag=$1; shift
mkdir -p .cache
t0=$(date +%s)
# The in-image suite starts once the sandbox part's first set-up (the `deployed` fixture: a 9 GB base pushed into
# the sandbox engine and read into the page cache, vLLM started) is over, or after at most 420 s: both that set-up
# and the in-image suite's own page-cache warm-up read ~10 GB from disk, and together they slowed the set-up from
# 41-108 s to 222 s. The in-image suite had the slack then (955 s of a 1,520 s sandbox part; 2026-12-06, fresh
# clones: 961 s and 1,237 s beside sandbox parts of 1,041 s and 1,216 s).
export E3_TEST_DEPLOYED_MARK="$PWD/.cache/sandbox-deployed"
rm -f "$E3_TEST_DEPLOYED_MARK"
(
  for _ in $(seq 1 "${E3_TEST_IMAGE_DELAY_MAX_S:-420}"); do [ -e "$E3_TEST_DEPLOYED_MARK" ] && break; sleep 1; done
  s=$(date +%s)
  echo "in-image suite: started $(( s - t0 )) s after the host suites" > .cache/test-image.log
  bash scripts/test-image.sh "$tag" >> .cache/test-image.log 2>&1
  irc=$?
  echo "in-image suite: exit $irc ($(( $(date +%s) - s )) s)" >> .cache/test-image.log
  exit "$irc"
) &
image_pid=$!
# The rest part runs in a cpu cgroup of lower weight (cgroup v1's cpu controller, when there and writable; its own
# sandboxes' sshd and processes inherit it): when it and the sandbox part both want the CPUs, the sandbox part's
# processes get them first; alone, the rest part still gets both cores. The weight balances the two (2026-12-06,
# fresh clones: at 256 the rest part ended last, 1,183 s against the sandbox part's 1,041 s; at 384, 1,293 s against
# 1,216 s, a slower run of the whole machine; at 512, before work was removed, the sandbox part ended last;
# 2026-12-07 at 384: the rest part ended last, 1,460 s against the sandbox part's 1,185 s and the in-image suite's
# 1,066 s, running alone its last 275 s: 512 again). Without cgroup v1 nothing
# changes. E3_TEST_REST_CPU_SHARES: its weight (root-level tasks and the /docker group weigh 1024 each).
rest_cg=""
if [ -f /sys/fs/cgroup/cpu/cpu.shares ] && mkdir -p /sys/fs/cgroup/cpu/eagle3ops-test-rest 2>/dev/null \
   && echo "${E3_TEST_REST_CPU_SHARES:-512}" > /sys/fs/cgroup/cpu/eagle3ops-test-rest/cpu.shares 2>/dev/null; then
  rest_cg=/sys/fs/cgroup/cpu/eagle3ops-test-rest
fi
(
  s=$(date +%s)
  if [ -n "$rest_cg" ]; then
    echo "$BASHPID" > "$rest_cg/cgroup.procs" && echo "rest part: cpu cgroup $rest_cg, cpu.shares $(cat "$rest_cg/cpu.shares")"
  fi > .cache/test-rest.log 2>&1
  .venv/bin/python -m pytest -ra --durations=10 --part rest "$@" tests --ignore=tests/image >> .cache/test-rest.log 2>&1
  rrc=$?
  echo "host suite, rest part: exit $rrc ($(( $(date +%s) - s )) s)" >> .cache/test-rest.log
  exit "$rrc"
) &
rest_pid=$!
.venv/bin/python -m pytest -ra --durations=10 --part sandbox "$@" tests --ignore=tests/image
sandbox_rc=$?
t_sandbox=$(( $(date +%s) - t0 ))
wait "$rest_pid"; rest_rc=$?
t_rest=$(( $(date +%s) - t0 ))
wait "$image_pid"; image_rc=$?
echo "==================== host suite, rest part (pytest --part rest) ===================="
cat .cache/test-rest.log
echo "==================== in-image suite (scripts/test-image.sh $tag) ===================="
cat .cache/test-image.log
# The disk each sandbox engine uses (data-root of each named sandbox, which outlives the run) and the build
# engine's store, so a CI log shows what the suites left on this machine.
echo "==================== disk: sandbox engines (du -s, MiB) and the build engine (docker system df) ===================="
timeout 120 du -s -B1M /var/lib/eagle3ops-sandbox/*/ 2>/dev/null || echo "(no sandbox data-root under /var/lib/eagle3ops-sandbox)"
timeout 60 docker system df 2>/dev/null || true
echo "host suite: sandbox part exit $sandbox_rc ($t_sandbox s), rest part exit $rest_rc (ended at $t_rest s);" \
     "in-image suite: exit $image_rc; all took $(( $(date +%s) - t0 )) s"
[ "$sandbox_rc" = 0 ] && [ "$rest_rc" = 0 ] && [ "$image_rc" = 0 ]
