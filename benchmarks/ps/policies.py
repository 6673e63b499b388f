"""Default mode of ``benchmarks/ps.py``: eager (decoupled) pull against coupled
push-then-pull, and ASP / SSP / eager against BSP with one slow worker (worker 3).

1 server + 4 workers; compute emulated (each step sleeps ``--compute-ms``, the slow worker
``--slow-factor`` times as long); the servers add ``--delay-ms`` to every message in each
direction. Each configuration runs for ``--seconds`` of wall time; workers then join."""
from __future__ import annotations

import statistics
import time

import torch
from mpi4py import MPI

from ripples.core.config import Config
from ripples.ps import start
from ripples.ps.optimizer import PSOptimizer

from .options import RANKS
from .record import save


def run_config(context, args, name, policy, slow, **kwargs):
    """One session for ``args.seconds``; returns this worker's numbers (gathered later)."""
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
    """One configuration's row from every worker's numbers."""
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



def main(args) -> None:
    """Every configuration in turn; worker 0 prints and writes the table."""
    context = start(MPI.COMM_WORLD, Config(ps_servers=1, timeout_s=60))
    if context.num_workers != 4:
        raise SystemExit(f"run with {RANKS['policies']} ranks (1 server + 4 workers)")
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
        save(args, {"benchmark": "ps", "compute": "emulated (sleep)", "table": table,
                    "ratios": ratios, "per_worker": flat})
