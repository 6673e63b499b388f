"""The porting guide's script as a job on the emulated 4-host cluster (``netcluster up 4
--slots 2``), for ``host_faults.py``: starting it, waiting until it trains, and looking at
the hosts (their network namespaces, ranks and private ``/dev/shm``)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .launch import job_env, netcluster

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3", "h4"]
TIMEOUT_S = 5.0
CHECKPOINT = "/dev/shm/ckpt.pt"
EPOCH = re.compile(r"^epoch (\d+) (?:steps|size) \d+ val_accuracy (\S+) time (\S+)s$", re.M)


def nc(*args, check=True) -> str:
    return subprocess.run([netcluster(), *args], capture_output=True, text=True,
                          check=check, timeout=60).stdout


def network_namespace(host: str) -> str:
    """``host``'s network namespace, as ``/proc/PID/ns/net`` names it."""
    return nc("exec", host, "readlink", "/proc/self/ns/net").strip()


def ranks_in(netns: str) -> list:
    """The pids of the training script's processes in network namespace ``netns`` (the
    cluster's hosts share one pid namespace)."""
    found = subprocess.run(["pgrep", "-f", "examples/epochs_"], capture_output=True,
                           text=True).stdout.split()
    mine = []
    for pid in found:
        try:
            if Path(f"/proc/{pid}/ns/net").readlink().as_posix() == netns:
                mine.append(int(pid))
        except OSError:
            pass  # ended meanwhile
    return mine


def checkpoints() -> list:
    """The hosts whose private ``/dev/shm`` holds the checkpoint."""
    return [host for host in HOSTS
            if subprocess.run([netcluster(), "exec", host, "test", "-e", CHECKPOINT],
                              capture_output=True, timeout=60).returncode == 0]


def reaches_epoch_4(job: subprocess.Popen, log: Path, retry: bool) -> bool:
    """Wait until the job prints epoch 4. False when its launch failed (a daemon did not
    report back, nothing trained) and ``retry``; any other end raises."""
    while not re.search(r"^epoch 4 ", log.read_text(errors="replace"), re.M):
        if job.poll() is not None or time.time() - log.stat().st_mtime > 180:
            output = log.read_text(errors="replace")
            if retry and job.poll() is not None and "failed to report back" in output \
                    and not EPOCH.search(output):
                return False
            raise RuntimeError(f"the job ended or stalled before epoch 4:\n{output[-3000:]}")
        time.sleep(0.05)
    return True


def launch(command: list, log: Path, extra_env: Optional[dict] = None):
    """Start the job and wait until it prints epoch 4: ``(job, launches)``. The emulated
    cluster now and then fails a launch: retried once, and counted. On any error the job is
    ended here."""
    launches = 0
    while True:
        launches += 1
        with open(log, "w") as out:
            job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                   env=job_env(extra_env), start_new_session=True)
        try:
            if reaches_epoch_4(job, log, retry=launches == 1):
                return job, launches
        except BaseException:
            end(job)
            raise
        time.sleep(2)


def end(job: subprocess.Popen) -> None:
    if job.poll() is None:
        subprocess.run(["kill", "-9", f"-{job.pid}"], capture_output=True)


def ripplesrun(*options: str) -> list:
    return [netcluster(), "exec", "h1", str(Path(sys.executable).parent / "ripplesrun"),
            "-np", "8", "-H", ",".join(f"{h}:2" for h in HOSTS), "--timeout", str(TIMEOUT_S),
            "--compute-ms", "20", *options]
