"""``benchmarks/ps.py --scenarios``: every policy on heterogeneous workers, training to a
target accuracy.

1 server + 8 workers: softmax regression on the bundled digits set, compute emulated per
micro-batch task (``--task-ms`` of sleep times a worker's slowdown) so that the results
measure synchronization. Scenarios: speeds ``{1,1,1,1,1/3,1/3,1/3,1/3}`` (the slow ones are
the odd workers), one 3x-slow worker (worker 7), random slowdowns (each task 3x slower with
probability 0.2). A step of the per-worker policies computes ``tasks_per_clock / 8`` tasks
as one local batch; EPSP and FlexRR compute the same global batch as ``tasks_per_clock``
tasks through a TaskSampler. Every row stops at the same global sample budget (the servers
count every worker's pushes); time to target is when worker 0's parameters first reach
``--target`` test accuracy."""
from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits

from ripples.core.config import Config
from ripples.ps import TaskSampler
from ripples.ps.optimizer import PSOptimizer
from ripples.startup import init

from .options import RANKS, SCENARIOS
from .record import save
from .scenario_report import bars, fmt, plot

ROWS = [  # (row, policy, options); lr_scale: per-push policies apply 8 updates where a
    # round applies one, so they take lr / 8 (as the digits check in the tests does)
    ("BSP", "bsp", {}), ("SSP(s=2)", "ssp", {"staleness": 2}), ("ASP", "asp", {}),
    ("DynSGD", "dynsgd", {}), ("ConSGD", "consgd", {}), ("Sync-opt(b=1)", "syncopt", {}),
    ("FlexRR-lite(s=2)", "flexrr", {"staleness": 2}), ("eager", "eager", {}),
    ("CASP(sort-and-cut)", "casp", {"communities": "projected", "regroup_every": 10}),
    ("CASP(learned)", "casp", {"communities": "learned", "regroup_every": 10}),
    ("EPSP(s=0)", "epsp", {"staleness": 0}), ("EPSP(s=2)", "epsp", {"staleness": 2}),
]
PER_PUSH = ("asp", "ssp", "eager")


def slowdown(scenario: str, worker: int, rng) -> float:
    """How many times slower than normal this worker computes its next task."""
    if scenario == "classes":
        return 3.0 if worker % 2 else 1.0
    if scenario == "one_slow":
        return 3.0 if worker == 7 else 1.0
    return 3.0 if rng.random() < 0.2 else 1.0


def digits_split():
    """Digits features scaled to [0, 1]: 1,497 training and 300 test samples."""
    data = load_digits()
    x = torch.from_numpy((data.data / 16.0).astype(np.float32))
    y = torch.from_numpy(data.target.astype(np.int64))
    order = np.random.RandomState(0).permutation(len(y))
    test, train = order[:300], order[300:]
    return x[train], y[train], x[test], y[test]


def train_row(context, args, scenario, row, policy, options, data):
    """One session until the global sample budget; returns this worker's record."""
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
            record["server"]["claims"] = board.get("claims")  # claim requests, all workers
            record["server"]["shares_last"] = board.get("shares_log", [[None, None]])[-1][1]
        if "community" in m:
            record["server"]["bytes_in_per_community"] = m["server_load"][0].get(
                "bytes_in_per_community")
    return record


def accuracy(params, xt, yt) -> float:
    """Test accuracy of softmax regression with ``params`` (weight, bias)."""
    with torch.no_grad():
        return ((xt @ params[0].T + params[1]).argmax(1) == yt).float().mean().item()


def summarize_row(records, args, data):
    """One table row from every worker's record of a session (worker 0's curve)."""
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



def main(args) -> None:
    """Every scenario x row; worker 0 prints and writes the table."""
    context = init(config=Config(ps_servers=1, timeout_s=60)).ps
    if context.num_workers != 8:
        raise SystemExit(f"run with {RANKS['scenarios']} ranks (1 server + 8 workers)")
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
                print(f"{scenario:<9}{row:<20}{fmt(t['time_to_target_s']):>9}"
                      f"{t['throughput_samples_per_s']:>9.0f}{t['push_bytes_per_sample']:>9.1f}"
                      f"{t['final_accuracy']:>8.3f}  {t['steps_per_worker']} {t['server']}",
                      flush=True)
    if context.worker != 0:
        return
    result = {"benchmark": "ps heterogeneous",
              "compute": "emulated (sleep per task) + real softmax regression on digits",
              "table": table, "bars": bars(table)}
    for line in result["bars"]:
        print(line)
    if args.json:
        save(args, result)
        plot(table, Path(args.json).with_suffix(".png"), args.target)
