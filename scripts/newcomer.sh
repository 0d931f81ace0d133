#!/usr/bin/env bash
# Newcomer check: clone this repository's committed HEAD (or REF) into a temporary folder and run README's two
# commands there -- `make demo`, then `make test` -- with a sandbox of its own (name, ports, state), so nothing from
# the working checkout (its .venv, .sandbox keys, untracked files) can help and the checkout's sandbox is never
# disturbed. What stays shared is machine-wide: Debian packages and the build engine's image/layer cache.
# Usage: [KEEP=1] bash scripts/newcomer.sh [REF] [make targets...]   (default targets: demo test; KEEP=1 keeps its sandbox)
# Prints one line per target with its exit code and wall time; the logs stay in the printed folder.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
ref=${1:-HEAD}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(demo test)
dir=$(mktemp -d /var/tmp/e3-newcomer-XXXXXX)
git clone -q --no-local "$src" "$dir/eagle3ops" && git -C "$dir/eagle3ops" checkout -q "$(git -C "$src" rev-parse "$ref")" \
  || { echo "newcomer: cannot clone $src at $ref" >&2; exit 2; }
export EAGLE3OPS_SANDBOX=${EAGLE3OPS_SANDBOX:-newcomer}
export EAGLE3OPS_SANDBOX_SSH_PORT=${EAGLE3OPS_SANDBOX_SSH_PORT:-2252}
export EAGLE3OPS_SANDBOX_SERVING_PORT=${EAGLE3OPS_SANDBOX_SERVING_PORT:-18052}
cd "$dir/eagle3ops" || exit 2
echo "newcomer: $(git rev-parse --short HEAD) in $dir/eagle3ops, sandbox $EAGLE3OPS_SANDBOX (ssh $EAGLE3OPS_SANDBOX_SSH_PORT, serving $EAGLE3OPS_SANDBOX_SERVING_PORT), CPU: $(grep -qw amx_tile /proc/cpuinfo && echo 'AVX-512 + AMX' || echo 'no AMX')"
rc=0
for t in "${targets[@]}"; do
  t0=$(date +%s)
  make "$t" >"$dir/$t.log" 2>&1
  r=$?
  echo "newcomer: make $t -> exit $r in $(( $(date +%s) - t0 )) s (log $dir/$t.log)"
  tail -n 3 "$dir/$t.log" | sed 's/^/    /'
  [ $r -eq 0 ] || rc=$r
done
# Its sandbox holds a copy of the 9 GB base image: remove it unless KEEP=1 (disk on a build machine is finite).
if [ "${KEEP:-0}" != 1 ]; then
  .venv/bin/python -m eagle3ops_dev sandbox down --name "$EAGLE3OPS_SANDBOX" --purge || true
fi
exit $rc
