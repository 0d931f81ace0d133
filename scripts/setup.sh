#!/usr/bin/env bash
# One-time (idempotent) set-up of this machine for eagle3ops: system packages, the build Docker engine, the driver
# venv. Needs root (apt, dockerd). Used by `make setup` (and so by `make demo`, `make test` and .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need_pkgs+=(debootstrap)
command -v patch >/dev/null || need_pkgs+=(patch)
command -v zstd >/dev/null || need_pkgs+=(zstd)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v tc >/dev/null || [ -x /usr/sbin/tc ] || need_pkgs+=(iproute2)
command -v curl >/dev/null || need_pkgs+=(curl)
# Compose v1 (Debian's docker-compose): the tests bring up a Compose-managed serving service with it.
command -v docker-compose >/dev/null || need_pkgs+=(docker-compose)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_pkgs+=(ca-certificates)
# Slurm and munge (Debian's slurm-wlm: slurmctld, slurmd, the clients): tests/test_fleet_slurm.py runs `render slurm`'s
# batch script as a job on a one-node cluster of its own (eagle3ops_dev.slurmlocal); no service is enabled or used.
{ command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ]; } || need_pkgs+=(slurm-wlm)
{ command -v munged >/dev/null || [ -x /usr/sbin/munged ]; } || need_pkgs+=(munge)
# HAProxy (Debian's haproxy): serving groups' tests put the real balancer in front of stand-in servers
# (eagle3ops_dev.haproxylocal starts its own; the package's service is not used).
{ command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ]; } || need_pkgs+=(haproxy)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# The build engine (where images are built). Debian's docker.io, classic overlay2 store.
if ! docker info >/dev/null 2>&1; then
  log "starting the build Docker engine (dockerd)"
  mkdir -p /var/log
  nohup dockerd >/var/log/eagle3ops-build-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/eagle3ops-build-dockerd.log" >&2; exit 1; }
fi

# The driver venv: light (no torch); the ML stack lives in the pipeline image.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
# Dependencies from the hash-pinned lock (requirements/driver.lock, made from requirements/driver.in), then
# eagle3ops itself editable with no dependency resolution and no build isolation (its build backend is in the lock).
# --no-deps for the lock too: it is uv's complete closure, and pip's resolver in --require-hashes mode refuses a
# package required with an extra whenever a newer release than the pin exists (pip #9644; it broke the local base's
# build on a fresh machine). `pip check` proves the closure complete for eagle3ops' own requirements.
if ! .venv/bin/python -c 'import eagle3ops, eagle3ops_dev, fabric, docker, typer, pytest, pytest_timeout' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ] || [ requirements/driver.lock -nt .venv/.installed ]; then
  log "installing eagle3ops and its driver dependencies into .venv (requirements/driver.lock)"
  if [ -z "${PIP_CERT:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt  # the system CA bundle (a TLS-intercepting proxy's CA)
  fi
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements/driver.lock
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  .venv/bin/pip check
  touch .venv/.installed
fi
# The development harness (src/eagle3ops_dev: sandbox host, demo, stand-in bases, trained target; `python -m
# eagle3ops_dev`) is not part of the eagle3ops distribution (pyproject.toml packages only eagle3ops): this checkout's
# src goes on the venv's path through a .pth file of its own, whatever layout the editable install chose.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/src" > "$site/eagle3ops-dev.pth"
.venv/bin/python -c 'import eagle3ops_dev.cli' || { echo "eagle3ops_dev is not importable from .venv ($site/eagle3ops-dev.pth)" >&2; exit 1; }
log "ready: $(docker version --format 'build engine {{.Server.Version}}'), $(.venv/bin/python --version)"
