"""A local, single-node Slurm cluster for the tests: Debian's slurmctld + slurmd with munge, all in a temp dir.

Real daemons (Debian bookworm's ``slurm-wlm`` 22.05 and ``munge`` 0.5, installed by ``scripts/setup.sh``), not a
stand-in: a munged with its own key and socket, one slurmctld and one slurmd for one node (this machine's short
hostname at 127.0.0.1, ``CPUs`` of the caller's choice) on free TCP ports, a configuration that needs no cgroups
(``proctrack/linuxproc``, ``task/none``), no accounting database and no systemd. Nothing is written outside the
directory given; every wait is bounded; :meth:`LocalSlurm.stop` ends exactly the processes it started (TERM, then
KILL after a bound). Clients (``sbatch``, ``sinfo``, the job's own ``srun``/``scontrol``) find the cluster
through ``SLURM_CONF`` in :attr:`LocalSlurm.env`.

Used by ``tests/test_fleet_slurm.py`` (``eagle3ops render slurm``'s submit script run as written: an extract array of
two tasks and vocab, then merge + train). The node's CPUs are the configured count (``SlurmdParameters=
config_overrides``), so a test may declare more than the machine has.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BINARIES", "JobResult", "LocalSlurm", "SlurmError", "missing_binaries"]

#: What the cluster needs on PATH (Debian: slurmctld, slurmd, slurm-client, munge; ``scripts/setup.sh``).
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel")


class SlurmError(RuntimeError):
    """The local cluster did not start or a job did not finish in its bound; the message names the log to read."""


def missing_binaries() -> list[str]:
    """The :data:`BINARIES` not on PATH (or in /usr/sbin)."""
    return [b for b in BINARIES if not (shutil.which(b) or Path("/usr/sbin", b).exists())]


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------- command lines

def munged_argv(d: Path) -> list[str]:
    """munged in the foreground (``-F``) with its key, socket, pid, log and seed under ``d`` (``-f``: the temp
    dir's permissions are not munge's recommended ones)."""
    return [_exe("munged"), "-F", "-f", f"--key-file={d / 'munge.key'}", f"--socket={d / 'munge.socket'}",
            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"]


def slurmctld_argv() -> list[str]:
    """slurmctld in the foreground, ignoring any saved state (``-i``)."""
    return [_exe("slurmctld"), "-D", "-i"]


def slurmd_argv() -> list[str]:
    """slurmd in the foreground."""
    return [_exe("slurmd"), "-D"]


def sinfo_state_argv() -> list[str]:
    """The node's state, one word (``idle`` once it registered)."""
    return [_exe("sinfo"), "-h", "-N", "-o", "%T"]


def sbatch_argv(script: Path, *, nodes: int, ntasks_per_node: int, chdir: Path) -> list[str]:
    """``sbatch`` of ``script`` with the geometry given on the command line (it takes precedence over the script's
    ``#SBATCH`` lines) and ``--parsable`` (the job id on the first line)."""
    return [_exe("sbatch"), "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={ntasks_per_node}",
            f"--chdir={chdir}", str(script)]


def job_state_argv(job: str) -> list[str]:
    """One job's record on one line (``JobState=...``, ``ExitCode=rc:signal``)."""
    return [_exe("scontrol"), "show", "job", "-o", job]


def scancel_argv(job: str) -> list[str]:
    """Cancel one job."""
    return [_exe("scancel"), job]


def slurm_conf(d: Path, *, node: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    """slurm.conf of a one-node cluster under ``d`` (root runs everything; no cgroups, accounting or systemd)."""
    return "\n".join([
        "ClusterName=eagle3ops-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'slurmd.pid'}",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        # the node's CPUs as configured, not as counted (a test's job may ask more than the machine's cores)
        "SlurmdParameters=config_overrides",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName=e3 Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


# ----------------------------------------------------------------------------------------------------- cluster

#: Job states after which a job runs no more.
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                      "BOOT_FAIL", "DEADLINE"})


@dataclass
class JobResult:
    """A finished batch job: its id, its exit status (the batch script's), seconds from submit to end (polled every
    0.5 s), its final state."""

    job: str
    returncode: int
    seconds: float
    state: str


@dataclass
class LocalSlurm:
    """One munged, one slurmctld and one slurmd under :attr:`root`; :meth:`start` them, :meth:`stop` them."""

    root: Path
    cpus: int = 2
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        """The cluster's slurm.conf."""
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster (clients and jobs)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process in stop()
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                             start_new_session=True)
        log.close()
        self.procs.append((name, p))

    def _check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                raise SlurmError(f"{name} exited with status {p.returncode} while starting; see "
                                 f"{self.root / (name + '.out')} and the logs in {self.root}")

    def start(self, timeout_s: float = 30.0) -> LocalSlurm:
        """Write the key and configuration, start munged, slurmctld and slurmd, wait (at most ``timeout_s``) until
        the node is ``idle``.

        Raises:
            SlurmError: a binary is missing (run ``bash scripts/setup.sh``), a daemon exited, or the node did not
                become idle in time (the logs are named).
        """
        missing = missing_binaries()
        if missing:
            raise SlurmError(f"not installed: {', '.join(missing)}; run `bash scripts/setup.sh` (Debian's slurm-wlm "
                             f"and munge)")
        munge = self.root / "munge"
        for d in (munge, self.root / "state", self.root / "spool"):
            d.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(slurm_conf(self.root, node=self.node, cpus=self.cpus, ctld_port=_free_port(),
                                        slurmd_port=_free_port()))
        deadline = time.monotonic() + timeout_s
        self._spawn("munged", munged_argv(munge))
        while not (munge / "munge.socket").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmError(f"munged made no socket in {timeout_s:.0f} s; see {munge / 'munged.log'}")
            time.sleep(0.1)
        self._spawn("slurmctld", slurmctld_argv())
        self._spawn("slurmd", slurmd_argv())
        state = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:  # a loaded machine's slurmctld may answer late: asked again, within the deadline
                cp = subprocess.run(sinfo_state_argv(), env=self.env, capture_output=True, text=True, timeout=10)
            except subprocess.TimeoutExpired:
                continue
            state = cp.stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.3)
        raise SlurmError(f"node {self.node} not idle after {timeout_s:.0f} s (sinfo: {state or 'no answer'}); see "
                         f"{self.root / 'slurmctld.log'} and {self.root / 'slurmd.log'}")

    def sbatch(self, script: Path, *, nodes: int, ntasks_per_node: int, chdir: Path, timeout_s: float) -> JobResult:
        """Submit ``script`` and wait for its end, at most ``timeout_s`` (:meth:`wait`).

        Raises:
            SlurmError: the submission failed, or the job did not end in time (cancelled; its output file is in
                ``chdir``).
        """
        t0 = time.monotonic()
        cp = subprocess.run(sbatch_argv(script, nodes=nodes, ntasks_per_node=ntasks_per_node, chdir=chdir),
                            env=self.env, capture_output=True, text=True, timeout=30)
        if cp.returncode != 0:
            raise SlurmError(f"sbatch {script} failed ({cp.returncode}): {cp.stderr.strip()}")
        return self.wait(cp.stdout.strip().split(";")[0], timeout_s=timeout_s, since=t0, where=chdir)

    def records(self, job: str) -> list[dict[str, str]]:
        """``scontrol show job -o JOB``'s records as fields (one per array task for an array job; kept by
        slurmctld for ``MinJobAge``, 300 s, after the job ends)."""
        out = subprocess.run(job_state_argv(job), env=self.env, capture_output=True, text=True, timeout=10).stdout
        return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines() if line.strip()]

    def wait(self, job: str, *, timeout_s: float, since: float | None = None, where: Path | None = None) -> JobResult:
        """Wait for ``job``'s end, at most ``timeout_s`` from ``since`` (``time.monotonic()``; default now), then
        cancel it; poll its state every 0.5 s (``sbatch --wait``'s own poll backs off to tens of seconds: measured,
        a job of 11 s took 42 s to be reported).

        Raises:
            SlurmError: the job did not end in time (cancelled; its output is in ``where``).
        """
        t0 = time.monotonic() if since is None else since
        record = ""
        while time.monotonic() - t0 < timeout_s:
            try:  # as in start(): a late answer is asked again, within the deadline
                record = subprocess.run(job_state_argv(job), env=self.env, capture_output=True, text=True,
                                        timeout=10).stdout
            except subprocess.TimeoutExpired:
                continue
            fields = dict(f.split("=", 1) for f in record.split() if "=" in f)
            if fields.get("JobState") in TERMINAL:
                rc = int(fields.get("ExitCode", "1:0").split(":")[0])
                return JobResult(job, rc, time.monotonic() - t0, fields["JobState"])
            time.sleep(0.5)
        subprocess.run(scancel_argv(job), env=self.env, capture_output=True, timeout=10)
        raise SlurmError(f"job {job} still running after {timeout_s:.0f} s ({record.strip()[:200]}): cancelled; see "
                         f"its output in {where or 'its working directory'} and {self.root / 'slurmd.log'}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """End the started daemons, newest first: TERM, then KILL whatever is left after ``timeout_s``."""
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout_s
        for _, p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()
