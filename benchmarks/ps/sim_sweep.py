"""``benchmarks/ps.py --sim-sweep``: the policies in the simulator (``ripples.sim``, the real
policy and controller logic on simulated time), over speed ratio x share of slow workers x
worker count x model size; time to a target loss and bytes pushed per sample.

Learning rates follow the real benchmark's convention (``budget.py``): BSP and EPSP ``lr``,
ASP and SSP ``lr / n``, a fixed CASP count ``C`` ``lr / C``, ``CASP(auto)`` scales each
push by its community's size, ``CASP(projected)`` pushes its members' mean at ``lr``. One
server link of ``--sim-gbps``; every worker computes ``--sim-step-ms`` per step times its
slowdown. Time to target: the servers' model reaches
``--sim-target`` test loss, checked before each step of worker 0 (a fast worker). Runs in
this process (no MPI)."""
from __future__ import annotations

import itertools
import time

from ripples.sim import Compute, Link, Network, Problem, Scenario, Speed, simulate

from .record import save

ROWS = ("BSP", "SSP(s=2)", "ASP", "CASP(auto)", "CASP(projected)", "CASP(C=2)", "CASP(C=4)",
        "EPSP(s=2)")


def scenario(row, workers, ratio, slow, model_mb, args) -> Scenario:
    """The simulator's scenario of one row."""
    knobs = {}
    if row == "BSP":
        mode = "ps-bsp"
    elif row == "ASP":
        mode = "ps-asp"
    elif row.startswith("SSP"):
        mode, knobs = "ps-ssp", {"staleness": 2}
    elif row.startswith("EPSP"):
        mode, knobs = "ps-epsp", {"staleness": 2}
    else:
        mode = "ps-casp"
        count = row[len("CASP("):-1]
        if count.startswith("C="):
            c = int(count[2:])
            knobs = {"communities": c, "push_lr_scale": 1.0 / c}
        else:
            knobs = {"communities": count}
        knobs["regroup_every"] = args.sim_regroup
    network = Network(workers_per_node=8, inter=Link(5e-6, args.sim_gbps * 1e9 / 8),
                      intra=Link(5e-6, 8 * args.sim_gbps * 1e9 / 8))
    return Scenario(mode, workers, Compute(args.sim_step_ms / 1000),
                    Speed("stragglers", count=slow, factor=ratio), network,
                    model_bytes=model_mb * 1e6, problem=Problem(lr=args.sim_lr),
                    horizon_s=args.sim_horizon, stop_at_target=True, eval_every=1,
                    target_loss=args.sim_target, target_on="average", **knobs)


def main(args) -> None:
    table = []
    rows = args.rows.split(",") if args.rows else ROWS
    for workers, ratio, share, model_mb in itertools.product(
            [int(v) for v in args.sim_workers.split(",")],
            [float(v) for v in args.ratios.split(",")],
            [float(v) for v in args.sim_shares.split(",")],
            [float(v) for v in args.sim_model_mb.split(",")]):
        slow = max(1, round(share * workers))
        for row in rows:
            began = time.perf_counter()
            result = simulate(scenario(row, workers, ratio, slow, model_mb, args))
            steps = sum(result.steps)
            # a CASP push is one per community round (the updates applied); the other
            # policies push once per worker step
            pushed = model_mb * 1e6 * (result.groups if row.startswith("CASP") else steps)
            t = {"workers": workers, "ratio": ratio, "slow": slow, "model_mb": model_mb,
                 "row": row, "time_to_target_s": result.time_to_target_s,
                 "steps_per_s": steps / result.sim_s,
                 "push_bytes_per_sample": pushed / max(steps, 1) / args.sim_batch,
                 "final_loss": result.final_loss, "wall_s": time.perf_counter() - began}
            table.append(t)
            ttt = "n/a" if t["time_to_target_s"] is None else f"{t['time_to_target_s']:.2f}"
            print(f"n{workers:<4} x{ratio:<5g}slow {slow:<4} {model_mb:>6g} MB  {row:<16}"
                  f"{ttt:>8}{t['steps_per_s']:>10.1f}{t['push_bytes_per_sample']:>12.0f}",
                  flush=True)
    if args.json:
        save(args, {"benchmark": "ps sim sweep", "compute": "simulated", "table": table})
