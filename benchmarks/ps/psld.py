"""``benchmarks/ps.py --psld``: static placements against PSLD with one slow server.

2 servers + 1 spare + 4 workers, BSP with emulated compute (``--compute-ms`` of sleep per
step), server 1 slowed ``--server-slow``x by ``RIPPLES_SERVER_SLOWDOWN`` (service cost
``--server-cost``, see ``ripples.ps.slowness``). Rows: every static placement (TensorFlow
round-robin, MXNet, BytePS hash, greedy by bytes) on the 2 servers, PSLD, PSLD without
exploration. Each row reports the median iteration time, per-server load max/mean
(servers' busy time over iterations 40-50 when the run is that long, else over its second
half), migrations, rollbacks, bytes moved, and the exactly-once check (every chunk updated
once per round, one owner, checksums equal)."""
from __future__ import annotations

import statistics
import time

import torch
from mpi4py import MPI

from ripples.core.config import Config
from ripples.ps import psld, start
from ripples.ps.optimizer import PSOptimizer

from .options import RANKS
from .record import save


PSLD_ROWS = [("static roundrobin (TensorFlow)", "roundrobin", None),
             ("static mxnet", "mxnet", None), ("static hash (BytePS)", "hash", None),
             ("static greedy (bytes)", "greedy", None),
             ("PSLD", "roundrobin", {"explore": True}),
             ("PSLD without exploration", "roundrobin", {"explore": False})]
# Tensor sizes as fractions of the model: a few large layers and a tail of small ones.
PSLD_SHAPE = [0.30, 0.18, 0.12, 0.10, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01, 0.01]


def psld_row(context, args, row, placement, options):
    """One BSP session of ``args.iterations`` steps; worker 0 returns the row."""
    worker = context.worker
    total = int(args.psld_mb * (1 << 20)) // 4
    params = [torch.nn.Parameter(torch.zeros(max(1, int(f * total)))) for f in PSLD_SHAPE]
    config = None if options is None else psld.PSLDConfig(
        window=args.psld_window, explore=options["explore"], epsilon=0.2, seed=1)
    ps = PSOptimizer(torch.optim.SGD(params, lr=1e-3), [(f"p{i}", p) for i, p in enumerate(params)],
                     context, policy="bsp", placement=placement, chunk_bytes=512 << 10,
                     timeout_s=120, psld=config)
    grads = [torch.full_like(p, 1.0 + worker) for p in params]
    context.worker_comm.Barrier()
    stamps = [time.monotonic()]
    marks = {}
    window = (40, 50) if args.iterations >= 50 else (args.iterations // 2, args.iterations)
    for step in range(args.iterations):
        time.sleep(args.compute_ms / 1000)
        for p, g in zip(params, grads):
            p.grad = g
        ps.step()
        stamps.append(time.monotonic())
        if worker == 0 and step + 1 in window:
            marks[step + 1] = (server_stats(ps), ps.map.members)
    ps.join()
    if worker != 0:
        return None
    final = server_stats(ps)
    times = [b - a for a, b in zip(stamps, stamps[1:])]
    (begin, _), (end, active) = marks[window[0]], marks[window[1]]
    busy = [end[s]["server_busy_s"] - begin[s]["server_busy_s"] for s in active]
    sizes = [c.nbytes for c in ps.map.chunks]
    owned = sorted(c for s in final.values() for c in s["chunks"])
    versions = {c: v for s in final.values() for c, v in s["versions"].items()}
    wrong = [c for c in range(len(sizes)) if versions.get(c) != args.iterations]
    flat = [p.detach().reshape(-1) for p in params]
    checksum_equal = all(
        s["checksum"][cid] == float(flat[ps.map.chunks[cid].param]
                                    [ps.map.chunks[cid].start:ps.map.chunks[cid].stop]
                                    .double().sum())
        for s in final.values() for cid in s["chunks"])
    summary = ps.metrics().get("psld", {})
    return {"row": row, "placement": placement, "psld": options,
            "iter_ms_median": 1000 * statistics.median(times),
            "iter_ms_median_second_half": 1000 * statistics.median(times[len(times) // 2:]),
            "load_window": list(window), "active_servers": list(active),
            "server_busy_ms": [round(1000 * b, 2) for b in busy],
            "load_max_over_mean": psld.load_ratio(busy),
            "bytes_per_server_final": [sum(sz for sz, o in zip(sizes, ps.map.owners) if o == s)
                                       for s in range(ps.map.num_servers)],
            "migrations": summary.get("migrations", 0), "rollbacks": summary.get("rollbacks", 0),
            "explorations": summary.get("explorations", 0),
            "chunks_moved": summary.get("chunks_moved", 0),
            "bytes_moved": summary.get("bytes_moved", 0),
            "decisions": [(d["clock"], d["kind"], len(d["chunks"]))
                          for d in summary.get("decisions", [])],
            "exactly_once": {"chunks": len(sizes), "one_owner_each": owned == list(range(len(sizes))),
                             "chunks_not_updated_once_per_round": wrong,
                             "checksums_equal": checksum_equal}}


def server_stats(ps):
    """Every server's statistics (busy time, chunks, versions, checksums), asked of each."""
    rids = {s: ps.channel.send(s, {"kind": "stats", "sid": ps.sid, "w": ps.worker})
            for s in ps.servers}
    return {s: ps.channel.wait(s, rid, 120, "stats")["stats"] for s, rid in rids.items()}


def main(args) -> None:
    """Every placement row in turn; worker 0 prints and writes the table and bars."""
    context = start(MPI.COMM_WORLD, Config.load(ps_servers=2, timeout_s=120))
    if context.num_workers != 4 or context.spare != 1:
        raise SystemExit(f"run with {RANKS['psld']} ranks: 2 servers + 1 spare + 4 workers")
    wanted = args.rows.split(",") if args.rows else None
    table = []
    for row, placement, options in PSLD_ROWS:
        if wanted and row not in wanted:
            continue
        result = psld_row(context, args, row, placement, options)
        if context.worker == 0:
            table.append(result)
            t = result
            print(f"{row:<32}{t['iter_ms_median']:>9.1f}{t['load_max_over_mean']:>9.2f}"
                  f"{t['migrations']:>6}{t['rollbacks']:>6}{t['bytes_moved'] / 2**20:>9.1f}  "
                  f"{t['bytes_per_server_final']} {t['exactly_once']}", flush=True)
    if context.worker != 0:
        return
    statics = [t for t in table if t["psld"] is None]
    best = min(statics, key=lambda t: t["iter_ms_median"]) if statics else None
    lines = []
    for t in table:
        if t["psld"] is None:
            continue
        if best:
            lines.append(f"{t['row']}: iteration time / best static ({best['row']}) = "
                         f"{t['iter_ms_median'] / best['iter_ms_median']:.2f} (bar <= 0.70)")
        lines.append(f"{t['row']}: load max/mean over iterations {t['load_window']} = "
                     f"{t['load_max_over_mean']:.2f} (bar < 1.3)")
    for t in table:
        ok = t["exactly_once"]
        lines.append(f"{t['row']}: exactly once: one owner each {ok['one_owner_each']}, "
                     f"chunks not updated once per round {ok['chunks_not_updated_once_per_round']}, "
                     f"checksums equal {ok['checksums_equal']}")
    print(f"compute: emulated (sleep {args.compute_ms:g} ms/step); {args.psld_mb:g} MB model, "
          f"BSP, 2 servers + 1 spare + 4 workers, server 1 slowed {args.server_slow:g}x "
          f"(service cost {args.server_cost} FIXED_MS:NS_PER_BYTE), {args.iterations} iterations")
    for line in lines:
        print(line)
    if args.json:
        save(args, {"benchmark": "ps psld", "compute": "emulated (sleep per step)",
                          "table": table, "bars": lines})

