"""A real single-node SLURM for the executor tests: munged, slurmctld and slurmd of Debian's packages
(``apt-get install slurm-wlm munge``: .ci/run installs them), started in a temporary folder and stopped by
their PIDs. Tests that need it skip where the daemons are missing or the tests do not run as root.

No accounting database: states come from squeue and scontrol, as the executor reads them. The controller and
node use free ports of their own, so clusters of two test sessions do not meet; ``cred_expire=10`` lets a
requeued job start again about 11 s later (120 s by default).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
SBIN = ("/usr/sbin", "/usr/local/sbin")


def _find(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing() -> str | None:
    """Why no cluster can start here (None: it can)."""
    absent = [d for d in (*DAEMONS, "sbatch") if _find(d) is None]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} missing: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a test SLURM runs its daemons as root (SlurmUser=root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One node, one partition ``debug``; ``env`` is what a client (sbatch, run_suite.py) needs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: dict[str, int] = {}

    def _write_config(self) -> None:
        node = subprocess.run([_find("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
        node_line = next(line for line in node.splitlines() if line.startswith("NodeName="))
        name = node_line.split()[0].split("=", 1)[1]
        r = self.root
        self.conf.write_text(f"""ClusterName=torchnlq-test
SlurmctldHost={name}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket},cred_expire=10
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=30
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def start(self) -> SlurmCluster:
        for folder in ("munge", "state", "spool", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        munge = self.root / "munge"
        subprocess.run([_find("munged"), "--force", f"--socket={self.socket}", f"--key-file={key}",
                        f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid",
                        f"--seed-file={munge}/munged.seed"], check=True, capture_output=True)
        self.pids["munged"] = int((munge / "munged.pid").read_text())
        self._write_config()
        for daemon, extra in (("slurmctld", ["-i"]), ("slurmd", [])):
            subprocess.run([_find(daemon), *extra], env=self.env, check=True, capture_output=True)
            pid_file = self.root / f"{daemon}.pid"
            self._wait(pid_file.is_file, f"{daemon} wrote no pid file")
            self.pids[daemon] = int(pid_file.read_text())
        self._wait(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False), "the node never became idle")
        return self

    def _wait(self, ready: object, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-2000:] for p in (self.root / "log").glob("*.log"))
                raise RuntimeError(f"test SLURM: {what}\n{logs}")
            time.sleep(0.3)

    def run(self, *args: str, check: bool = True) -> str:
        """A client command against this cluster; its stdout."""
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr}")
        return done.stdout

    def jobs(self) -> dict[str, tuple[str, str]]:
        """Every job in the queue: {id: (state, reason)}."""
        out = self.run("squeue", "-h", "-r", "-o", "%i|%T|%r")
        return {p[0]: (p[1], p[2]) for p in (line.split("|") for line in out.splitlines()) if len(p) == 3}

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons (slurmd, slurmctld, munged) by their PIDs."""
        try:
            self.run("scancel", "--full", "--quiet", "-u", "root", check=False)
            self._wait(lambda: not self.jobs(), "jobs left after scancel", timeout=45)
        except (OSError, subprocess.TimeoutExpired, RuntimeError):
            pass
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(daemon)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a generator fixture
    """A started single-node SLURM for the tests of one module (skipped where it cannot run)."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def main(argv: list[str]) -> int:
    """``python tests/helpers/slurm_cluster.py FOLDER``: the tests' one-node SLURM for trying the slurm executor
    without a cluster (as root, with Debian's slurm-wlm and munge); it runs until Ctrl-C, then stops its daemons."""
    import argparse

    parser = argparse.ArgumentParser(prog="python tests/helpers/slurm_cluster.py", description=main.__doc__)
    parser.add_argument("folder", help="a folder for its state (made if missing)")
    folder = parser.parse_args(argv).folder
    why = missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    cluster = SlurmCluster(Path(folder).resolve()).start()
    print(f"a one-node SLURM is up (partition debug, no GPUs); in another shell:\n"
          f"  export SLURM_CONF={cluster.conf}\n"
          f"  python scripts/run_suite.py SUITE.toml --executor slurm --executor.partition debug "
          f"--executor.gpus_per_run 0\nCtrl-C stops it.", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # sigwait takes them, in order
    sys.exit(main(sys.argv[1:]))
