"""Parameter-server policies: eager (decoupled) pull against coupled push-then-pull, and
ASP / SSP / eager against BSP with one slow worker; with ``--scenarios``, every policy on
heterogeneous workers, training to a target accuracy.

Default mode: 1 server + 4 workers. Compute is emulated (each step sleeps ``--compute-ms``; a slow worker
sleeps ``factor`` times as long) and the servers add ``--delay-ms`` to every message in each
direction, so that communication (a pull is a round trip: 2 x delay) is comparable to compute.
Each configuration runs for ``--seconds`` of wall time; workers then join.

    python benchmarks/ps.py --json benchmarks/results/ps.json

launches itself under ``mpiexec -n 5`` (or run it under mpiexec yourself).

``--scenarios`` (1 server + 8 workers, ``mpiexec -n 9``): softmax regression on the
bundled digits set, compute emulated per micro-batch task (``--task-ms`` of sleep times a
worker's slowdown) so that the results measure synchronization. Scenarios: speeds
``{1,1,1,1,1/3,1/3,1/3,1/3}`` (the slow ones are the odd workers), one 3x-slow worker
(worker 7), random slowdowns (each task 3x slower with probability 0.2). A step of the
per-worker policies computes ``tasks_per_clock / 8`` tasks as one local batch; EPSP and
FlexRR compute the same global batch as ``tasks_per_clock`` tasks through a TaskSampler.
Every row stops at the same global sample budget (the servers count every worker's
pushes); time to target is when worker 0's parameters first reach ``--target`` test
accuracy.

    python benchmarks/ps.py --scenarios --json benchmarks/results/ps_heterogeneous.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RANKS = 5
SCENARIO_RANKS = 9


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-ms", type=float, default=40.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--params", type=int, default=100_000, help="model size (float32 elements)")
    parser.add_argument("--json", default="", help="write the results to this path")
    parser.add_argument("--scenarios", action="store_true",
                        help="8 workers + 1 server, every policy, heterogeneous speeds")
    parser.add_argument("--task-ms", type=float, default=8.0, help="emulated compute per task")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--tasks-per-clock", type=int, default=32)
    parser.add_argument("--budget-rounds", type=int, default=80,
                        help="sample budget, in global batches")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--target", type=float, default=0.91)
    parser.add_argument("--link-ms", type=float, default=5.0)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--rows", default="", help="comma-separated row names")
    return parser.parse_args()


def relaunch(ranks: int = RANKS) -> int:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(ranks), "--oversubscribe",
           "--bind-to", "none", sys.executable, *sys.argv]
    return subprocess.call(cmd, env=env)


def run_config(context, args, name, policy, slow, **kwargs):
    """One session for ``args.seconds``; returns this worker's numbers (gathered later)."""
    import torch
    from ripples.ps.optimizer import PSOptimizer

    worker = context.worker
    param = torch.nn.Parameter(torch.zeros(args.params))
    ps = PSOptimizer(torch.optim.SGD([param], lr=0.01), [("w", param)], context, policy=policy,
                     link_delay_s=args.delay_ms / 1000, timeout_s=60, **kwargs)
    compute_s = args.compute_ms / 1000 * (args.slow_factor if slow and worker == 3 else 1.0)
    grad = torch.ones(args.params)
    context.worker_comm.Barrier()
    began = time.monotonic()
    stamps = [began]
    while time.monotonic() - began < args.seconds:
        time.sleep(compute_s)
        param.grad = grad
        ps.step()
        stamps.append(time.monotonic())
    elapsed = stamps[-1] - began
    ps.join()
    m = ps.metrics()
    steps = len(stamps) - 1
    hist = m["staleness_hist"]
    return {"config": name, "policy": policy, "worker": worker, "steps": steps,
            "elapsed_s": elapsed,
            "iter_ms_median": 1000 * statistics.median(b - a for a, b in zip(stamps, stamps[1:])),
            "blocked_ms_per_step": 1000 * m["time_blocked_s"] / max(steps, 1),
            "mean_staleness": sum(d * c for d, c in hist.items()) / max(sum(hist.values()), 1),
            "updates": m["server_load"][0]["updates"]}


def summarize(rows, args, name, slow):
    mine = [r for r in rows if r["config"] == name]
    compute = args.compute_ms / 1000
    speeds = [1 / (compute * (args.slow_factor if slow and r["worker"] == 3 else 1)) for r in mine]
    throughput = sum(r["steps"] / r["elapsed_s"] for r in mine)
    return {"config": name, "policy": mine[0]["policy"], "slow_worker": slow,
            "iter_ms_median_fast_workers": statistics.median(
                r["iter_ms_median"] for r in mine if not (slow and r["worker"] == 3)),
            "steps_per_s_total": throughput, "ceiling_steps_per_s": sum(speeds),
            "fraction_of_ceiling": throughput / sum(speeds),
            "blocked_ms_per_step": statistics.mean(r["blocked_ms_per_step"] for r in mine),
            "mean_staleness": mine[0]["mean_staleness"], "server_updates": mine[0]["updates"],
            "steps_per_worker": [r["steps"] for r in sorted(mine, key=lambda r: r["worker"])]}


# -- heterogeneous scenarios (--scenarios) -------------------------------------------------
SCENARIOS = ("classes", "one_slow", "random")
ROWS = [  # (row, policy, options); lr_scale: per-push policies apply 8 updates where a
    # round applies one, so they take lr / 8 (as the digits check in the tests does)
    ("BSP", "bsp", {}), ("SSP(s=2)", "ssp", {"staleness": 2}), ("ASP", "asp", {}),
    ("DynSGD", "dynsgd", {}), ("ConSGD", "consgd", {}), ("Sync-opt(b=1)", "syncopt", {}),
    ("FlexRR-lite(s=2)", "flexrr", {"staleness": 2}), ("eager", "eager", {}),
    ("CASP(sort-and-cut)", "casp", {"communities": "auto", "regroup_every": 10}),
    ("EPSP(s=0)", "epsp", {"staleness": 0}), ("EPSP(s=2)", "epsp", {"staleness": 2}),
]
PER_PUSH = ("asp", "ssp", "eager")


def slowdown(scenario: str, worker: int, rng) -> float:
    if scenario == "classes":
        return 3.0 if worker % 2 else 1.0
    if scenario == "one_slow":
        return 3.0 if worker == 7 else 1.0
    return 3.0 if rng.random() < 0.2 else 1.0


def digits_split():
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.from_numpy((data.data / 16.0).astype(np.float32))
    y = torch.from_numpy(data.target.astype(np.int64))
    order = np.random.RandomState(0).permutation(len(y))
    test, train = order[:300], order[300:]
    return x[train], y[train], x[test], y[test]


def train_row(context, args, scenario, row, policy, options, data):
    """One session until the global sample budget; returns this worker's record."""
    import random

    import torch
    from ripples.ps import TaskSampler
    from ripples.ps.optimizer import PSOptimizer

    worker, workers = context.worker, context.num_workers
    xs, ys, _, _ = data
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    lr = args.lr / workers if policy in PER_PUSH else args.lr
    task_options = {"tasks_per_clock": args.tasks_per_clock} if policy in ("epsp", "flexrr") else {}
    ps = PSOptimizer(torch.optim.SGD(model.parameters(), lr=lr), model.named_parameters(),
                     context, policy=policy, link_delay_s=args.link_ms / 1000, timeout_s=60,
                     **options, **task_options)
    rng = random.Random(1000 * SCENARIOS.index(scenario) + worker)
    share = args.tasks_per_clock // workers
    per_step = share * args.micro_batch  # samples of one worker step
    global_batch = args.tasks_per_clock * args.micro_batch
    budget = args.budget_rounds * global_batch
    gen = torch.Generator().manual_seed(worker)
    loss_fn = torch.nn.functional.cross_entropy

    def compute(indices):
        time.sleep(args.task_ms / 1000 * slowdown(scenario, worker, rng))
        loss_fn(model(xs[indices]), ys[indices]).backward()

    context.worker_comm.Barrier()
    began = time.monotonic()
    snapshots = [(0.0, [p.detach().clone() for p in model.parameters()])]
    steps = 0
    if policy in ("epsp", "flexrr"):
        sampler = TaskSampler(ps, len(ys), args.micro_batch, seed=1)
        for _ in range(args.budget_rounds):
            for indices in sampler:
                compute(torch.tensor(indices))
            ps.step()
            steps += 1
            if worker == 0:
                snapshots.append((time.monotonic() - began,
                                  [p.detach().clone() for p in model.parameters()]))
    else:
        while ps.total_pushes * per_step < budget:
            ps.zero_grad()
            for _ in range(share):
                compute(torch.randint(0, len(ys), (args.micro_batch,), generator=gen))
            for p in model.parameters():
                p.grad /= share  # the mean over the local batch
            ps.step()
            steps += 1
            if worker == 0:
                snapshots.append((time.monotonic() - began,
                                  [p.detach().clone() for p in model.parameters()]))
    elapsed = time.monotonic() - began
    ps.join()
    m = ps.metrics()
    samples = len(m["tasks"]["task_log"]) * args.micro_batch if "tasks" in m \
        else steps * per_step
    record = {"scenario": scenario, "row": row, "policy": policy, "worker": worker,
              "steps": steps, "samples": samples, "elapsed_s": elapsed,
              "bytes_pushed": m["bytes_pushed"], "bytes_pulled": m["bytes_pulled"],
              "final": [p.detach().clone() for p in model.parameters()]}
    if worker == 0:
        record["snapshots"] = snapshots
        record["server"] = {k: m["server_load"][0].get(k) for k in (
            "updates", "dropped", "communities", "plan_history", "tasks_applied")}
        if "task_board" in m:
            board = m["task_board"]
            record["server"]["transfers"] = board.get("transfers")
            record["server"]["shares_last"] = board.get("shares_log", [[None, None]])[-1][1]
        if "community" in m:
            record["server"]["bytes_in_per_community"] = m["server_load"][0].get(
                "bytes_in_per_community")
    return record


def accuracy(params, xt, yt) -> float:
    import torch
    with torch.no_grad():
        return ((xt @ params[0].T + params[1]).argmax(1) == yt).float().mean().item()


def summarize_row(records, args, data):
    _, _, xt, yt = data
    zero = next(r for r in records if r["worker"] == 0)
    curve = [(t, accuracy(p, xt, yt)) for t, p in zero["snapshots"]]
    hit = next((t for t, a in curve if a >= args.target), None)
    samples = sum(r["samples"] for r in records)
    wall = max(r["elapsed_s"] for r in records)
    pushed = sum(r["bytes_pushed"] for r in records)
    pulled = sum(r["bytes_pulled"] for r in records)
    return {"scenario": zero["scenario"], "row": zero["row"], "policy": zero["policy"],
            "time_to_target_s": hit, "wall_s": wall, "samples": samples,
            "throughput_samples_per_s": samples / wall,
            "push_bytes_per_sample": pushed / samples, "pull_bytes_per_sample": pulled / samples,
            "final_accuracy": accuracy(zero["final"], xt, yt),
            "steps_per_worker": [r["steps"] for r in sorted(records, key=lambda r: r["worker"])],
            "server": zero["server"], "curve": [(round(t, 3), round(a, 4)) for t, a in curve]}


def scenarios_main(args):
    from mpi4py import MPI

    from ripples.config import Config
    from ripples.startup import init

    context = init(config=Config(ps_servers=1, timeout_s=60)).ps
    if context.num_workers != 8:
        raise SystemExit(f"run with {SCENARIO_RANKS} ranks (1 server + 8 workers)")
    data = digits_split()
    scenarios = args.only.split(",") if args.only else SCENARIOS
    rows = [r for r in ROWS if not args.rows or r[0] in args.rows.split(",")]
    table = []
    for scenario in scenarios:
        for row, policy, options in rows:
            record = train_row(context, args, scenario, row, policy, options, data)
            everyone = context.worker_comm.gather(record)
            if context.worker == 0:
                table.append(summarize_row(everyone, args, data))
                t = table[-1]
                print(f"{scenario:<9}{row:<20}{_fmt(t['time_to_target_s']):>9}"
                      f"{t['throughput_samples_per_s']:>9.0f}{t['push_bytes_per_sample']:>9.1f}"
                      f"{t['final_accuracy']:>8.3f}  {t['steps_per_worker']} {t['server']}",
                      flush=True)
    if context.worker != 0:
        return
    result = {"benchmark": "ps heterogeneous", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
              "compute": "emulated (sleep per task) + real softmax regression on digits",
              "command": "python benchmarks/ps.py " + " ".join(sys.argv[1:]),
              "args": vars(args), "table": table, "bars": bars(table)}
    for line in result["bars"]:
        print(line)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        plot(table, Path(args.json).with_suffix(".png"), args.target)


def _fmt(value):
    return "n/a" if value is None else f"{value:.2f}"


def bars(table):
    """The comparisons the project set itself, computed from one run's rows."""
    by = {(t["scenario"], t["row"]): t for t in table}
    lines = []

    def time_of(scenario, row):
        t = by.get((scenario, row))
        return None if t is None else t["time_to_target_s"]

    casp = time_of("classes", "CASP(sort-and-cut)")
    best = [time_of("classes", r) for r in ("BSP", "SSP(s=2)", "ASP")]
    best = min((b for b in best if b is not None), default=None)
    if casp is not None and best is not None:
        lines.append(f"classes: CASP time to target / best of BSP,SSP,ASP = {casp / best:.2f} "
                     f"(bar <= {1 / 1.3:.2f})")
    else:
        lines.append(f"classes: CASP time {casp}, best of BSP/SSP/ASP {best} (a row missed the target)")
    c, a = by.get(("classes", "CASP(sort-and-cut)")), by.get(("classes", "ASP"))
    if c and a:
        lines.append(f"classes: CASP push bytes per sample / ASP = "
                     f"{c['push_bytes_per_sample'] / a['push_bytes_per_sample']:.2f} (bar <= 0.75)")
        lines.append(f"classes: CASP communities {c['server'].get('communities')}")
    for row in ("EPSP(s=0)", "EPSP(s=2)"):
        mine = time_of("one_slow", row)
        for other in ("FlexRR-lite(s=2)", "Sync-opt(b=1)", "ConSGD", "DynSGD", "BSP"):
            theirs = time_of("one_slow", other)
            ratio = "n/a" if mine is None or theirs is None else f"{mine / theirs:.2f}"
            lines.append(f"one_slow: {row} time to target / {other} = {ratio}"
                         + (" (bar <= 0.60)" if other == "BSP" else " (bar < 1)"))
    for scenario in {t["scenario"] for t in table}:
        bsp = by.get((scenario, "BSP"))
        for row in ("CASP(sort-and-cut)", "EPSP(s=0)", "EPSP(s=2)", "FlexRR-lite(s=2)"):
            t = by.get((scenario, row))
            if bsp and t:
                lines.append(f"{scenario}: {row} final accuracy - BSP = "
                             f"{100 * (t['final_accuracy'] - bsp['final_accuracy']):+.1f} points "
                             f"(bar >= -1)")
    return lines


def plot(table, path, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted({t["scenario"] for t in table}, key=SCENARIOS.index)
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4.5), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios):
        for t in (t for t in table if t["scenario"] == scenario):
            times, accs = zip(*t["curve"])
            ax.plot(times, accs, label=t["row"], linewidth=1.2)
        ax.axhline(target, color="grey", linestyle=":")
        ax.set_title(scenario)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test accuracy (worker 0)")
        ax.set_ylim(0.5, 1.0)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    args = parse()
    if "OMPI_COMM_WORLD_SIZE" not in os.environ and "PMI_SIZE" not in os.environ:
        sys.exit(relaunch(SCENARIO_RANKS if args.scenarios else RANKS))
    if args.scenarios:
        scenarios_main(args)
        return
    from mpi4py import MPI

    from ripples.config import Config
    from ripples.ps import start

    context = start(MPI.COMM_WORLD, Config(ps_servers=1, timeout_s=60))
    if context.num_workers != 4:
        raise SystemExit(f"run with {RANKS} ranks (1 server + 4 workers)")
    configs = [
        ("coupled", "eager", False, {"coupled": True}),
        ("eager", "eager", False, {}),
        ("bsp slow", "bsp", True, {}),
        ("asp slow", "asp", True, {}),
        (f"ssp(s={args.staleness}) slow", "ssp", True, {"staleness": args.staleness}),
        ("eager slow", "eager", True, {}),
    ]
    rows = []
    for name, policy, slow, kwargs in configs:
        rows.append(run_config(context, args, name, policy, slow, **kwargs))
    everyone = context.worker_comm.gather(rows)
    if context.worker != 0:
        return
    flat = [r for part in everyone for r in part]
    table = [summarize(flat, args, name, slow) for name, _, slow, _ in configs]
    by = {t["config"]: t for t in table}
    ratios = {
        "eager_vs_coupled_iter_time": by["eager"]["iter_ms_median_fast_workers"]
        / by["coupled"]["iter_ms_median_fast_workers"],
        **{f"{name.split(' ')[0]}_vs_bsp_throughput_slow": by[name]["steps_per_s_total"]
           / by["bsp slow"]["steps_per_s_total"]
           for name in by if name.endswith("slow") and not name.startswith("bsp")},
    }
    print(f"compute: emulated (sleep {args.compute_ms:g} ms/step, slow worker x{args.slow_factor:g}),"
          f" injected delay {args.delay_ms:g} ms per message each way, {args.params} float32 "
          f"parameters, 1 server + 4 workers, {args.seconds:g} s per configuration")
    print(f"{'config':<16}{'iter ms':>9}{'steps/s':>9}{'ceiling':>9}{'frac':>7}"
          f"{'blocked ms':>12}{'staleness':>11}  steps per worker")
    for t in table:
        print(f"{t['config']:<16}{t['iter_ms_median_fast_workers']:>9.1f}{t['steps_per_s_total']:>9.1f}"
              f"{t['ceiling_steps_per_s']:>9.1f}{t['fraction_of_ceiling']:>7.2f}"
              f"{t['blocked_ms_per_step']:>12.1f}{t['mean_staleness']:>11.2f}  {t['steps_per_worker']}")
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    if args.json:
        result = {"benchmark": "ps", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
                  "compute": "emulated (sleep)", "command": "python benchmarks/ps.py "
                  + " ".join(sys.argv[1:]), "args": vars(args), "table": table, "ratios": ratios,
                  "per_worker": flat}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
