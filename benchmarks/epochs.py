"""Epoch-loop benchmark: the porting guide's scripts, run for the same epochs in every mode.

    python benchmarks/epochs.py --np 4 --repeats 3 --json benchmarks/results/epochs_np4.json

The script users write (``examples/epochs_horovod.py``: DistributedSampler, fixed epochs,
StepLR, a per-epoch all-reduce of the validation accuracy, a rank-0 checkpoint; digits MLP,
batch 16), as:

- ``allreduce``: that script with only its import changed to ``ripples.torch`` (Horovod's
  script on ripples' all-reduce);
- ``ripples-dropin``: the same, also with ``sync="ripples"`` and ``hvd.DistributedSampler``
  and nothing else (the three lines a user changes first);
- ``ripples``: ``examples/epochs_ripples.py``, the port (also ``model=`` and
  ``hvd.average_model`` before each evaluation);
- ``adpsgd``: the port with ``--sync adpsgd`` (asynchronous AD-PSGD);
- ``ddp``: ``benchmarks/epochs_ddp.py``, the script written for PyTorch DDP (gloo);
- ``horovod``: the unchanged script on Horovod itself, where it is installed (``bash
  benchmarks/install_horovod.sh``; the row is left out otherwise). Its emulated compute
  follows ripples' rule, padded between the forward pass and ``backward()`` as in the DDP
  row: no row's communication overlaps the emulated compute (ripples waits for its
  buckets when backward ends, as DDP does, and pads in ``step()``).

``--script metrics-every-batch`` runs ``examples/metrics_every_batch.py`` instead (the shape
of Horovod's ImageNet example: metrics all-reduced every batch), in the modes
``allreduce``, ``ripples`` and ``adpsgd`` (the script as written) and ``ripples-epoch-metrics``,
``adpsgd-epoch-metrics`` (its ``--metrics epoch``: metrics all-reduced once per epoch);
ratios are to that script's ``allreduce``.

Scenarios: ``homogeneous``; ``one-slow`` (the last rank 4x slower); ``random-slow`` (each
step, each rank 5x slower with probability 0.1). Compute is EMULATED: every step is padded
to ``--compute-ms`` by sleeping (ripples' ``RIPPLES_COMPUTE_MS``), so that ranks sharing
few cores measure synchronization, not CPU contention. The time is rank 0's, from the start
of the first epoch to the end of the last (after its metric all-reduce, so every rank is
done); start-up is not counted. Repeats are interleaved (each repeat runs every mode once)
so that the shared machine's drift hits every mode alike; the table gives medians and the
ratio of each mode's median time to all-reduce's in the same scenario, next to the
ceiling: the time ratio if every rank worked at its own speed with no waiting at all.

Across hosts: ``--netcluster`` starts every job on the emulated cluster of ``netcluster
up`` (from h1; its hostfile places the ranks), as ``benchmarks/train.py`` does:

    netcluster up 4 --slots 2 --bw 1gbit
    python benchmarks/epochs.py --netcluster --np 8 --json out.json
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from harness import launch, report, stats

ROOT = Path(__file__).resolve().parent.parent
MODES = ["allreduce", "ripples-dropin", "ripples", "adpsgd", "ddp", "horovod"]
SCRIPT_MODES = {
    "epochs": MODES,
    "metrics-every-batch": ["allreduce", "ripples", "ripples-epoch-metrics", "adpsgd",
                            "adpsgd-epoch-metrics"],
}
# The Horovod script's own lines where the horovod row pads its emulated compute.
HOROVOD_PADDING = [
    ("hvd.init()\n", "hvd.init()\n"
     "from ripples.core.config import Config as _Config\n"
     "from ripples.core.heterogeneity import SlowdownInjector as _Injector\n"
     "_injector = _Injector.from_config(_Config.load(), hvd.rank(), hvd.size())\n"),
    # The first step's compute starts with the timed loop, as ripples' starts at wrapping.
    ("began = time.perf_counter()\n", "began = time.perf_counter()\n"
     "_step_end = time.perf_counter()\n"),
    ("        F.cross_entropy(model(data), target).backward()\n",
     "        _loss = F.cross_entropy(model(data), target)\n"
     "        _injector.finish_step(time.perf_counter() - _step_end)\n"
     "        _loss.backward()\n"),
    ("        optimizer.step()\n", "        optimizer.step()\n"
     "        _step_end = time.perf_counter()\n"),
]
SCENARIOS = {
    "homogeneous": {},
    "one-slow": {"RIPPLES_SLOWDOWN": "{last}:4"},
    "random-slow": {"RIPPLES_RANDOM_SLOWDOWN": "0.1:5"},
}
EPOCH_LINE = re.compile(r"^epoch (\d+) steps \d+ val_accuracy (\S+) time (\S+)s$", re.M)


def ceiling_ratio(scenario: str, size: int) -> float:
    """Time of a fixed amount of work at every rank's own speed, over all-reduce's time for
    it (which moves at the slowest rank's pace, step by step)."""
    if scenario == "one-slow":  # speeds 1 (size - 1 ranks) and 1/4; all-reduce: size * 1/4
        return (size / 4) / (size - 1 + 1 / 4)
    if scenario == "random-slow":  # mean step 0.9 + 0.1 * 5; all-reduce waits for the max
        p_any = 1 - 0.9 ** size
        return (0.9 + 0.1 * 5) / (1 + 4 * p_any)
    return 1.0


def _replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"examples/epochs_horovod.py changed: {old!r} is not there once")
    return text.replace(old, new)


def write_scripts(directory: Path, script: str = "epochs") -> dict:
    """The command line (after ``python``) of every mode of ``script``; variants written
    into ``directory``."""
    if script == "metrics-every-batch":
        example = str(ROOT / "examples" / "metrics_every_batch.py")
        return {"allreduce": [example, "--sync", "allreduce"],
                "ripples": [example, "--sync", "ripples"],
                "ripples-epoch-metrics": [example, "--sync", "ripples", "--metrics", "epoch"],
                "adpsgd": [example, "--sync", "adpsgd"],
                "adpsgd-epoch-metrics": [example, "--sync", "adpsgd", "--metrics", "epoch"]}
    horovod = (ROOT / "examples" / "epochs_horovod.py").read_text()
    allreduce = _replace_once(horovod, "import horovod.torch as hvd", "import ripples.torch as hvd")
    dropin = _replace_once(allreduce, "tud.distributed.DistributedSampler(",
                           "hvd.DistributedSampler(")
    dropin = _replace_once(dropin, "named_parameters=model.named_parameters())",
                           'named_parameters=model.named_parameters(), sync="ripples")')
    padded = horovod
    for old, new in HOROVOD_PADDING:
        padded = _replace_once(padded, old, new)
    (directory / "allreduce.py").write_text(allreduce)
    (directory / "dropin.py").write_text(dropin)
    (directory / "horovod_row.py").write_text(padded)  # not horovod.py: it would shadow the package
    port = str(ROOT / "examples" / "epochs_ripples.py")
    return {"allreduce": [str(directory / "allreduce.py")],
            "ripples-dropin": [str(directory / "dropin.py")],
            "ripples": [port, "--sync", "ripples"], "adpsgd": [port, "--sync", "adpsgd"],
            "ddp": [str(ROOT / "benchmarks" / "epochs_ddp.py")],
            "horovod": [str(directory / "horovod_row.py")]}


def run_once(args, command, scenario: str, repeat: int, checkpoint: Path) -> dict:
    """One job of ``command`` (a mode's script) for ``args.epochs`` epochs; rank 0's time
    and accuracy read from its epoch lines."""
    settings = {k: v.format(last=args.np - 1) for k, v in SCENARIOS[scenario].items()}
    env = dict(RIPPLES_COMPUTE_MS=str(args.compute_ms), RIPPLES_SEED=str(repeat),
               RIPPLES_BENCH_PORT=str(launch.free_port()), **settings)
    if args.netcluster:
        env["RIPPLES_BENCH_ADDRESS"] = "h1"  # the cluster's hostfile puts rank 0 there
    checkpoint.unlink(missing_ok=True)
    argv = [sys.executable, *command, "--epochs", str(args.epochs), "--checkpoint",
            str(checkpoint)]
    done = launch.run_job(args.np, argv, env=env, timeout=args.timeout, capture=True,
                          check=False, across_hosts=args.netcluster)
    epochs = EPOCH_LINE.findall(done.stdout)
    if done.returncode != 0 or len(epochs) != args.epochs:
        raise RuntimeError(f"{' '.join(done.args)} failed ({done.returncode}):\n{done.stdout}\n"
                           f"{done.stderr[-3000:]}")
    return {"wall_s": float(epochs[-1][2]), "accuracy": float(epochs[-1][1]),
            "epoch_s": [float(t) for _, _, t in epochs]}


def summarize(scenario: str, runs: dict, size: int) -> dict:
    """Medians over repeats of every mode, and their ratios to all-reduce's."""
    rows = {}
    base = stats.median(r["wall_s"] for r in runs["allreduce"])
    base_accuracy = stats.median(r["accuracy"] for r in runs["allreduce"])
    for mode, mode_runs in runs.items():
        wall = stats.median(r["wall_s"] for r in mode_runs)
        accuracy = stats.median(r["accuracy"] for r in mode_runs)
        rows[mode] = {"wall_s_median": wall, "time_vs_allreduce": stats.ratio(wall, base),
                      "accuracy_median": accuracy,
                      "accuracy_vs_allreduce": accuracy - base_accuracy,
                      "runs": mode_runs}
    return {"ceiling_time_vs_allreduce": ceiling_ratio(scenario, size), "modes": rows}


def table(scenario: str, summary: dict) -> str:
    lines = [f"scenario {scenario}: ceiling {summary['ceiling_time_vs_allreduce']:.2f}x "
             "all-reduce's time",
             f"{'mode':<16} {'time(s)':>8} {'x allred':>8} {'accuracy':>8} {'vs allred':>9} "
             f"{'runs (s)':>20}"]
    for mode, row in summary["modes"].items():
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in row["runs"])
        lines.append(f"{mode:<16} {row['wall_s_median']:>8.2f} {row['time_vs_allreduce']:>7.2f}x "
                     f"{row['accuracy_median']:>8.4f} {row['accuracy_vs_allreduce']:>+9.4f} "
                     f"{walls:>20}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--script", default="epochs", choices=sorted(SCRIPT_MODES),
                        help="the porting guide's epoch scripts, or metrics_every_batch.py")
    parser.add_argument("--modes", default=None,
                        help="comma-separated, of the script's modes (default: all; "
                             f"{SCRIPT_MODES}); allreduce always runs")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--netcluster", action="store_true",
                        help="run on the emulated cluster of 'netcluster up' (from h1)")
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    known = SCRIPT_MODES[args.script]
    asked = known if args.modes is None else [m for m in args.modes.split(",") if m]
    modes = [m for m in known if m in asked or m == "allreduce"]
    wrong = [s for s in scenarios if s not in SCENARIOS] + [m for m in asked if m not in known]
    if wrong:
        parser.error(f"unknown {wrong}; scenarios: {list(SCENARIOS)}, modes: {known}")
    if "horovod" in modes and importlib.util.find_spec("horovod") is None:
        modes.remove("horovod")
        print("horovod: not installed, row left out (bash benchmarks/install_horovod.sh)",
              flush=True)
    print(f"epoch-loop benchmark ({args.script}): {args.np} ranks on {os.cpu_count()} cores, "
          f"{args.epochs} "
          f"epochs, compute EMULATED ({args.compute_ms:g} ms/step), {args.repeats} interleaved "
          f"repeats, {time.strftime('%Y-%m-%d')}", flush=True)
    result = {"compute": "emulated", "args": vars(args), "scenarios": {}}
    if args.netcluster:
        result["cluster"] = launch.cluster_status()
        print(result["cluster"], flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        commands = write_scripts(Path(scratch), args.script)
        for scenario in scenarios:
            runs = {mode: [] for mode in modes}
            for repeat in range(args.repeats):
                for mode in modes:
                    runs[mode].append(run_once(args, commands[mode], scenario, repeat,
                                               Path(scratch) / f"{mode}.pt"))
            summary = summarize(scenario, runs, args.np)
            result["scenarios"][scenario] = summary
            print(table(scenario, summary), flush=True)
    if args.json:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
