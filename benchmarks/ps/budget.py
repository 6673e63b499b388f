"""``benchmarks/ps.py --budget`` and ``--sweep``: policies on the digits MLP under one wall
clock budget, 1 server + 8 workers.

Each row trains ``ripples.demo``'s MLP (64-64-64-10, or ``--hidden`` wide) on digits for
``--seconds`` of wall time per policy; compute is EMULATED: every step sleeps
``--compute-ms`` times the worker's slowdown before its real forward and backward, so that
9 processes on 2 cores measure synchronization, not CPU contention. SGD with momentum 0.9
at ``--mlp-lr`` (``lr``) for BSP and EPSP (one update per clock: the mean over its
tasks); policies that apply every push alone (ASP, SSP) take ``lr / 8``, a fixed CASP
count ``C`` takes ``lr / C`` (a community push is the mean of ``8 / C`` workers),
``CASP(auto)`` scales each push by its community's size itself, and ``CASP(projected)``
(the analytic projection's count, its pushes the members' mean) takes ``lr``. The CASP
rows regroup every ``--casp-regroup`` rounds (5; the option's own default is 20); the loop
reports each step's loss (``report_loss``) unless ``--no-loss-reports``.

``--budget``: the held-out setting (workers 4-7 at ``--slow-factor``), BSP, ASP and the
CASP rows; steps per second, final accuracy of the servers' model.
``--sweep``: speed ratio x share of slow workers x model width, every row; time to
``--target`` accuracy (worker 0's parameters, checked every 5 of its steps), bytes
pushed per sample and the share of pushes computed on stale parameters; the *held* time
to target (the mean of the last 3 evaluations reaches it: a swing above the target that
falls back does not count, ``ps/sweep_summary.py``). With
``--sweep-repeats N`` each setting runs its rows N times, interleaved (row by row, then
again), and the file's ``rows`` are the medians (``ps/sweep_summary.py``); ``table``
keeps every run."""
from __future__ import annotations

import itertools
import time

import torch

from ripples.core.config import Config
from ripples.demo import accuracy, load_data, make_model
from ripples.ps import TaskSampler
from ripples.ps.optimizer import PSOptimizer
from ripples.startup import init

from .options import RANKS
from .record import save
from .sweep_summary import HELD_EVALUATIONS, held_time, summarize_runs

WORKERS = 8
BUDGET_ROWS = ("BSP", "ASP", "CASP(auto)", "CASP(projected)", "CASP(C=2)")
SWEEP_ROWS = ("BSP", "SSP(s=2)", "ASP", "CASP(auto)", "CASP(projected)", "CASP(C=2)",
              "CASP(C=4)", "EPSP(s=0)", "EPSP(s=2)")


def row_setup(row: str, lr: float, regroup_every: int = 5):
    """(policy, options, learning rate) of a row name."""
    if row == "BSP":
        return "bsp", {}, lr
    if row == "ASP":
        return "asp", {}, lr / WORKERS
    if row.startswith("SSP"):
        return "ssp", {"staleness": _staleness(row)}, lr / WORKERS
    if row.startswith("EPSP"):
        return "epsp", {"staleness": _staleness(row), "tasks_per_clock": 4 * WORKERS}, lr
    if row.startswith("CASP(C="):
        count = int(row[len("CASP(C="):-1])
        return "casp", {"communities": count, "regroup_every": regroup_every}, lr / count
    mode = row[len("CASP("):-1]
    return "casp", {"communities": mode, "regroup_every": regroup_every}, lr


def _staleness(row: str) -> int:
    """The ``s`` of a row named like ``SSP(s=2)``."""
    if "(s=" not in row or not row.endswith(")"):
        raise SystemExit(f"row {row!r}: name its staleness, e.g. {row.split('(')[0]}(s=2)")
    return int(row[row.index("(s=") + 3:-1])


def train_row(context, args, row, slow, data):
    """One session of ``args.seconds``; returns this worker's record."""
    worker = context.worker
    policy, options, lr = row_setup(row, args.mlp_lr, args.casp_regroup)
    model = make_model(data.x_train.shape[1], data.classes, seed=0)
    if args.hidden != 64:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, data.classes))
    ps = PSOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                     model.named_parameters(), context, policy=policy,
                     link_delay_s=args.link_ms / 1000, timeout_s=60, **options)
    x, y = data.x_train[worker::WORKERS], data.y_train[worker::WORKERS]
    gen = torch.Generator().manual_seed(worker)
    compute_s = args.compute_ms / 1000 * (args.slow_factor if worker in slow else 1.0)
    loss_fn = torch.nn.functional.cross_entropy
    curve, steps = [], 0
    context.worker_comm.Barrier()
    began = time.monotonic()
    if policy == "epsp":  # the same samples per clock as a round: 4 tasks of batch / 4
        # every worker maps task ids to the same samples of the whole training set
        sampler = TaskSampler(ps, len(data.y_train), args.batch // 4, seed=1)
        while not _over(context, began, args.seconds, steps):
            for indices in sampler:
                time.sleep(compute_s / 4)
                loss_fn(model(data.x_train[indices]), data.y_train[indices]).backward()
            ps.step()
            steps += 1
            _evaluate(worker, steps, began, model, data, curve)
    else:
        while time.monotonic() - began < args.seconds:
            time.sleep(compute_s)
            index = torch.randint(len(y), (args.batch,), generator=gen)
            ps.zero_grad()
            loss = loss_fn(model(x[index]), y[index])
            loss.backward()
            if not args.no_loss_reports:
                ps.report_loss(loss.item())
            ps.step()
            steps += 1
            _evaluate(worker, steps, began, model, data, curve)
    wall = time.monotonic() - began
    ps.join()
    m = ps.metrics()
    record = {"worker": worker, "steps": steps, "wall_s": wall,
              "samples": steps * args.batch, "bytes_pushed": m["bytes_pushed"],
              "final_accuracy": accuracy(model, data.x_test, data.y_test), "curve": curve}
    if worker == 0:
        server = m["server_load"][0]
        record["communities"] = server.get("communities")
        record["plan_history"] = server.get("plan_history")
        record["casp_windows"] = server.get("casp_windows")
        record["staleness_hist"] = server.get("staleness_hist")
    return record


def _over(context, began, seconds, steps) -> bool:
    """EPSP runs the same clocks on every worker: worker 0's clock decides, every 5."""
    if steps % 5:
        return False
    return context.worker_comm.bcast(time.monotonic() - began >= seconds, root=0)


def _evaluate(worker, steps, began, model, data, curve) -> None:
    if worker == 0 and steps % 5 == 0:
        curve.append((round(time.monotonic() - began, 3),
                      round(accuracy(model, data.x_test, data.y_test), 4)))


def summarize(records, row, scenario, target):
    zero = next(r for r in records if r["worker"] == 0)
    wall = max(r["wall_s"] for r in records)
    samples = sum(r["samples"] for r in records)
    hit = next((t for t, a in zero["curve"] if a >= target), None)
    # the final point of a policy that applies stale pushes swings by several points from
    # one evaluation to the next: the mean over the last second is reported beside it
    late = [a for t, a in zero["curve"] if t >= wall - 1.0] or [zero["final_accuracy"]]
    return {**scenario, "slow_workers": len(scenario["slow"]), "row": row,
            "final_count": len(zero["communities"]) if zero.get("communities") else None,
            "steps_per_s": sum(r["steps"] for r in records) / wall,
            "final_accuracy": zero["final_accuracy"],
            "last_second_accuracy": sum(late) / len(late), "time_to_target_s": hit,
            "time_to_target_held_s": held_time(zero["curve"], target),
            "push_bytes_per_sample": sum(r["bytes_pushed"] for r in records) / samples,
            "steps_per_worker": [r["steps"] for r in sorted(records, key=lambda r: r["worker"])],
            "communities": zero.get("communities"), "plan_history": zero.get("plan_history"),
            "casp_windows": zero.get("casp_windows"),
            "stale_push_share": _stale_share(zero.get("staleness_hist")),
            "staleness_hist": sorted((int(k), v) for k, v in
                                     (zero.get("staleness_hist") or {}).items()),
            "curve": zero["curve"]}


def _stale_share(hist):
    """The share of the servers' pushes computed on parameters that had since been updated
    (``staleness_hist``: updates missed -> pushes)."""
    if not hist:
        return None
    return sum(v for k, v in hist.items() if int(k) > 0) / sum(hist.values())


def scenarios(args):
    """The settings this run covers (one for --budget)."""
    if args.budget:
        return [{"ratio": args.slow_factor, "slow": [4, 5, 6, 7], "hidden": args.hidden}]
    out = []
    for ratio, share, hidden in itertools.product(
            [float(v) for v in args.ratios.split(",")], [int(v) for v in args.shares.split(",")],
            [int(v) for v in args.widths.split(",")]):
        out.append({"ratio": ratio, "slow": list(range(WORKERS - share, WORKERS)),
                    "hidden": hidden})
    return out


def main(args) -> None:
    context = init(config=Config(ps_servers=1, timeout_s=60)).ps
    if context.num_workers != WORKERS:
        raise SystemExit(f"run with {RANKS['budget']} ranks (1 server + 8 workers)")
    data = load_data()
    rows = args.rows.split(",") if args.rows else (BUDGET_ROWS if args.budget else SWEEP_ROWS)
    compute = (f"emulated: sleep {args.compute_ms:g} ms per step times the slowdown, then "
               f"the real forward and backward of the digits MLP; 9 processes on this "
               f"machine's cores")
    if context.worker == 0:
        print(f"compute {compute}; {args.seconds:g} s per policy", flush=True)
    repeats = 1 if args.budget else args.sweep_repeats
    if repeats < 1:
        raise SystemExit(f"--sweep-repeats {repeats}: give at least 1")
    table = []
    for scenario in scenarios(args):
        args.slow_factor, args.hidden = scenario["ratio"], scenario["hidden"]
        for repeat, row in itertools.product(range(repeats), rows):
            record = train_row(context, args, row, set(scenario["slow"]), data)
            everyone = context.worker_comm.gather(record)
            if context.worker == 0:
                t = {**summarize(everyone, row, scenario, args.target), "repeat": repeat}
                table.append(t)
                ttt = "n/a" if t["time_to_target_s"] is None else f"{t['time_to_target_s']:.2f}"
                print(f"x{t['ratio']:<5g}slow {len(t['slow'])} h{t['hidden']:<5}{row:<16}"
                      f"{t['steps_per_s']:>8.1f}{t['final_accuracy']:>7.3f}{ttt:>7}"
                      f"{t['push_bytes_per_sample']:>9.0f}  {t['communities']}", flush=True)
    if context.worker != 0:
        return
    result = {"benchmark": "ps budget" if args.budget else "ps sweep",
              "compute": compute, "table": table}
    if repeats > 1:
        result["rows"] = summarize_runs(table)
        print_medians(result["rows"], repeats)
    if args.json:
        save(args, result)


def print_medians(rows, repeats) -> None:
    print(f"medians of {repeats} runs: steps/s, time to target (every run), vs the best "
          f"fixed policy; the same held (mean of {HELD_EVALUATIONS} evaluations)", flush=True)
    for r in rows:
        print(f"x{r['ratio']:<5g}slow {r['slow_workers']} {r['row']:<16}"
              f"{r['steps_per_s']:>8.1f}  {_times(r, '')}  {_times(r, '_held')}", flush=True)


def _times(row, kind) -> str:
    times = " ".join("-" if t is None else f"{t:.2f}"
                     for t in row[f"times_to_target{kind}_s"])
    versus = row[f"vs_best_fixed{kind}"]
    return f"[{times}] {'-' if versus is None else f'{versus:.2f}x'}"
