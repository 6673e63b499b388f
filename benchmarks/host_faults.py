"""Losing one host of 4 while the porting guide's script trains, on an emulated cluster.

    python benchmarks/host_faults.py --repeats 3 --json benchmarks/results/host_faults_4x2.json

The script makes the cluster itself (``netcluster up 4 --slots 2 --bw 1gbit``: 4 network
namespaces, 2 ranks each, real TCP links) and takes it down at the end. Every run starts
``examples/epochs_ripples.py`` (a DistributedSampler epoch loop, ``average_model``, a
per-epoch accuracy all-reduce, rank 0 saving a checkpoint every epoch) from host h1:

    ripplesrun -np 8 -H h1:2,h2:2,h3:2,h4:2 --timeout 5 --compute-ms 20 [--fault-tolerant]
        python examples/epochs_ripples.py --epochs 40 --sync MODE --checkpoint /dev/shm/ckpt.pt

and, once rank 0 has printed epoch 4, loses host h3 (ranks 4 and 5):

* ``cut`` (with ``--fault-tolerant``): h3's cable is pulled. The 6 ranks of h1, h2 and h4
  must go on as a 6-rank world and finish the 40 epochs, stalling at most timeout + 5 s;
  h3's ranks must be gone within the same bound; every host has its own ``/dev/shm``, so
  a checkpoint found on any host but h1 was written by the cut side (split brain).
* ``freeze`` (with ``--fault-tolerant``): every process of h3 is stopped (SIGSTOP), as a
  hung machine; the same bars as a cut (the frozen ranks are gone once ``ripplesrun``
  ends the job).
* ``kill`` (without it): every process of h3 is killed. The job must end non-zero within
  15 s and name h3.
* ``rank-raise`` and ``rank-stop`` (without it, MODE ``ripples``): not a host but one of
  its ranks (rank 5) misbehaves at the end of epoch 5 (``benchmarks/harness/inject_fault.py``
  wraps the script): an uncaught error, or the process stops (SIGSTOP). The job must end
  non-zero naming rank 5, within 15 s of an error and timeout + 5 s of a stop.
* ``heal`` (with ``--fault-tolerant``): h3's cable is pulled and put back 2 s later, well
  within the timeout. All 8 ranks must finish the 40 epochs as one world, stalling at most
  the cut + 5 s.
* MODE ``elastic`` runs ``examples/epochs_elastic.py`` instead: all-reduce training in
  ``hvd.elastic.run``, rolled back to its last commit.
* ``kill-ft`` (not run unless asked): the same kill under ``--fault-tolerant``, held to
  the bars of a cut. Open MPI 5.0's runtime ends a job that loses a host's daemon,
  fault tolerant or not, so it fails them.

Compute is emulated (``--compute-ms 20``) on 2 shared cores; the times are wall times
measured by this driver around the job, and the stall is the longest epoch less the
median one.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.cluster_job import (CHECKPOINT, EPOCH, HOSTS, TIMEOUT_S, checkpoints,  # noqa: E402
                                 end, launch, nc, network_namespace, ranks_in, ripplesrun)
from harness.report import write_json  # noqa: E402

LOST = "h3"
LOSE = {"cut": ("cut", LOST), "freeze": ("kill", LOST, "STOP"), "kill": ("kill", LOST),
        "kill-ft": ("kill", LOST), "heal": ("cut", LOST)}
HEAL_AFTER_S = 2.0  # the ``heal`` case's cut: well within the timeout
RANK_FAULTS = {"rank-raise": "raise", "rank-stop": "stop"}  # one rank, not a host
FAULT_RANK = 5  # on h3
SURVIVORS = re.compile(r"the (\d+) survivors go on")


def script_for(mode: str) -> list:
    """The porting guide's script in ``mode``, or its elastic all-reduce twin."""
    if mode == "elastic":
        return ["examples/epochs_elastic.py"]
    return ["examples/epochs_ripples.py", "--sync", mode]


def rank_run(case: str, log: Path) -> dict:
    """One rank of h3 (rank 5) misbehaves at the end of epoch 5, without
    ``--fault-tolerant``: it raises an uncaught error, or it stops (SIGSTOP)."""
    kind = RANK_FAULTS[case]
    for host in HOSTS:
        nc("exec", host, "rm", "-f", CHECKPOINT)
    command = ripplesrun("-x", "FAULT", "-x", "FAULT_RANK", "-x", "FAULT_AT", sys.executable,
                          "benchmarks/harness/inject_fault.py", *script_for("ripples"),
                          "--epochs", "40", "--checkpoint", CHECKPOINT)
    fault_env = {"FAULT": kind, "FAULT_RANK": str(FAULT_RANK), "FAULT_AT": "6"}
    job = None
    try:
        job, launches = launch(command, log, fault_env)
        try:
            code, ended = job.wait(timeout=120), time.time()
        except subprocess.TimeoutExpired:  # a hang: recorded, and every bar fails
            code, ended = None, None
    finally:
        if job is not None:
            end(job)
        for host in HOSTS:
            nc("kill", host, check=False)
    output = log.read_text(errors="replace")
    fault = re.search(r"^FAULT \S+ on rank \d+ at ([\d.]+)$", output, re.M)
    after = ended - float(fault.group(1)) if fault and ended is not None else None
    named = (f"rank {FAULT_RANK} raised an uncaught RuntimeError" in output if kind == "raise"
             else f"rank(s) [{FAULT_RANK}] (on {LOST})" in output)
    bound = 15 if kind == "raise" else TIMEOUT_S + 5
    epochs = EPOCH.findall(output)
    return {"case": case, "mode": "ripples", "exit_status": code, "launches": launches,
            "last_epoch": int(epochs[-1][0]) if epochs else None, "stall_s": None,
            "lost_host_ranks_gone_after_s": None, "job_ended_after_s": after,
            "names_the_rank": named, "checkpoint_on": checkpoints(),
            "bars": {f"the job ends non-zero within {bound:g} s of the fault":
                     code not in (0, None) and after is not None and after <= bound,
                     f"rank {FAULT_RANK} is named": named}}


def one_run(case: str, mode: str, log: Path) -> dict:
    for host in HOSTS:
        nc("exec", host, "rm", "-f", CHECKPOINT)
    command = ripplesrun(*(["--fault-tolerant"] if case != "kill" else []), sys.executable,
                          *script_for(mode), "--epochs", "40", "--checkpoint", CHECKPOINT)
    job = None
    try:
        job, launches = launch(command, log)
        lost_netns = network_namespace(LOST)
        lost_ranks = ranks_in(lost_netns)
        nc(*LOSE[case])
        lost_at = time.time()
        if case == "heal":
            time.sleep(HEAL_AFTER_S)
            nc("heal", LOST)
        # frozen ranks never end by themselves: the job's end ends them
        while case not in ("freeze", "heal") and ranks_in(lost_netns) and \
                time.time() - lost_at < 120:
            time.sleep(0.1)
        gone_after = time.time() - lost_at if case not in ("freeze", "heal") else None
        try:
            code = job.wait(timeout=120)
            ended_after = time.time() - lost_at
        except subprocess.TimeoutExpired:  # a hang: recorded, and every bar fails
            code, ended_after = None, None
        outlived_the_job = ranks_in(lost_netns)
    finally:
        if job is not None:
            end(job)
        nc("heal", LOST, check=False)
        for host in HOSTS:
            nc("kill", host, check=False)
    output = log.read_text(errors="replace")
    epochs = [(int(e), float(a), float(t)) for e, a, t in EPOCH.findall(output)]
    durations = [b[2] - a[2] for a, b in zip(epochs, epochs[1:])]
    survivors = SURVIVORS.findall(output)
    result = {"case": case, "mode": mode, "exit_status": code, "lost_ranks": len(lost_ranks),
              "launches": launches,
              "epochs_printed": len(epochs), "last_epoch": epochs[-1][0] if epochs else None,
              "final_accuracy": epochs[-1][1] if epochs else None,
              "stall_s": (max(durations) - statistics.median(durations)) if durations else None,
              "lost_host_ranks_gone_after_s": gone_after, "job_ended_after_s": ended_after,
              "lost_host_ranks_outlived_the_job": len(outlived_the_job),
              "survivor_world_sizes": sorted({int(n) for n in survivors}),
              "recovered_losing_nobody": "was lost (" in output,
              "names_lost_host": f"host(s) {LOST} were lost" in output
              or f"(on {LOST})" in output,
              "checkpoint_on": checkpoints(),
              "tracebacks": output.count("Traceback")}
    bound = TIMEOUT_S + 5
    if case == "heal":
        result["bars"] = {
            "all 8 ranks finish the 40 epochs as one world, exit status 0":
                result["last_epoch"] == 39 and not survivors and code == 0,
            f"stall <= the cut + 5 s ({HEAL_AFTER_S + 5:g} s)":
                result["stall_s"] is not None and result["stall_s"] <= HEAL_AFTER_S + 5,
            "checkpoints on h1 only": result["checkpoint_on"] == ["h1"]}
    elif case != "kill":
        result["bars"] = {
            "the 6 others finish the 40 epochs as a 6-rank world, exit status 0":
                result["last_epoch"] == 39 and result["survivor_world_sizes"] == [6]
                and code == 0,
            f"stall <= timeout + 5 s ({bound:g} s)":
                result["stall_s"] is not None and result["stall_s"] <= bound,
            (f"the lost host's ranks are gone within {bound:g} s" if case != "freeze" else
             "the frozen ranks do not outlive the job"):
                not outlived_the_job if case == "freeze" else gone_after <= bound,
            "no checkpoint written on the lost side": result["checkpoint_on"] == ["h1"]}
    else:
        result["bars"] = {"the job ends non-zero within 15 s":
                          code not in (0, None) and ended_after <= 15,
                          "the lost host is named": result["names_lost_host"]}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cases",
                        default="cut:ripples,cut:adpsgd,cut:elastic,freeze:ripples,kill:ripples,"
                                "heal:ripples,rank-raise:ripples,rank-stop:ripples",
                        help="CASE:MODE pairs (cases: cut, freeze, kill, heal, kill-ft, "
                             "rank-raise, rank-stop (ripples only); modes: "
                             "ripples, adpsgd, allreduce (not elastic: the survivors raise), "
                             "elastic (examples/epochs_elastic.py))")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--logs", default="/tmp/host_faults", help="each run's output")
    args = parser.parse_args()
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    nc("up", "4", "--slots", "2", "--bw", "1gbit")
    runs = []
    try:
        for repeat in range(args.repeats):
            for pair in args.cases.split(","):
                case, mode = pair.split(":")
                log = Path(args.logs) / f"{case}_{mode}_{repeat}.log"
                run = rank_run(case, log) if case in RANK_FAULTS else one_run(case, mode, log)
                run["log"] = str(log)
                runs.append(run)
                failed = [name for name, ok in run["bars"].items() if not ok]
                print(f"{case:4s} {mode:8s} exit {run['exit_status']} last epoch "
                      f"{run['last_epoch']} stall {run['stall_s'] or 0:.1f} s, {LOST} gone "
                      f"after {run['lost_host_ranks_gone_after_s'] or float('nan'):.1f} s, "
                      "job ended after "
                      f"{run['job_ended_after_s'] or float('inf'):.1f} s, checkpoint on "
                      f"{run['checkpoint_on']}: {'all bars met' if not failed else failed}",
                      flush=True)
    finally:
        nc("down", check=False)
    if args.json:
        write_json(args.json, {"setup": "4 emulated hosts x 2 ranks (netcluster, 1 Gbit/s), "
                               "examples/epochs_ripples.py, compute emulated 20 ms a step, "
                               f"timeout {TIMEOUT_S:g} s; {LOST} lost once epoch 4 is printed",
                               "rows": runs})
    return 0 if all(all(r["bars"].values()) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
