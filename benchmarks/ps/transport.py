"""``benchmarks/ps.py --transport``: push + pull of a ``--model-mb`` model (default 64 MB
in 4 MB chunks) between a server (rank 0) and a worker (rank 1), the pickled messages the
servers used before (numpy arrays inside pickled dicts, with their copies, rebuilt here
from the same helpers) against the buffer transport (header + raw bytes into pooled
buffers); the server applies the same SGD step in both. Then ``PSOptimizer`` itself (1
server, ASP) for the end-to-end time."""
from __future__ import annotations

import statistics
import time

import torch
from mpi4py import MPI

from ripples.core.config import Config
from ripples.ps import start
from ripples.ps import transport as tr
from ripples.ps.optimizer import PSOptimizer

from .record import save


def main(args) -> None:
    """Rank 0 serves, rank 1 pushes and pulls; both ways in one run, alternating."""
    comm = MPI.COMM_WORLD.Dup()
    chunk = 4 << 20
    numel = int(args.model_mb * (1 << 20)) // 4
    bounds = [(a, min(a + chunk // 4, numel)) for a in range(0, numel, chunk // 4)]
    params = torch.randn(numel)
    lr = 1e-3
    pool = tr.BufferPool()
    outbox = tr.Outbox(comm)
    rows = {"pickled": [], "buffer": []}

    def wait_sent():
        outbox.flush(time.monotonic() + 60, "benchmark send")

    def receive(source, tag):
        status = MPI.Status()
        while not comm.Iprobe(source=source, tag=tag, status=status):
            pass
        return tr.receive(comm, source, tag, pool, 60, "benchmark")

    def serve(kind):
        header, payload = receive(1, tr.REQUEST)
        if kind == "pickled":  # what the servers did before: copies out of the message
            grads = {cid: tr.from_wire(g) for cid, g in header["grads"].items()}
        else:
            views = tr.unpack(payload, [(b - a, torch.float32) for a, b in bounds])
            grads = dict(enumerate(views))
        for cid, (a, b) in enumerate(bounds):
            params[a:b].add_(grads[cid], alpha=-lr)
        if payload is not None:
            pool.give(payload)
        receive(1, tr.REQUEST)  # the pull
        if kind == "pickled":
            outbox.send(1, {"params": {cid: tr.to_wire(params[a:b]).copy()
                                       for cid, (a, b) in enumerate(bounds)}}, tr.REPLY)
        else:
            out = tr.pack(pool, [params[a:b] for a, b in bounds])
            outbox.send(1, {"chunks": len(bounds)}, tr.REPLY, out, lambda: pool.give(out))
        wait_sent()

    def work(kind, grad, mine):
        began = time.perf_counter()
        if kind == "pickled":
            outbox.send(0, {"grads": {cid: tr.to_wire(grad[a:b])
                                      for cid, (a, b) in enumerate(bounds)}}, tr.REQUEST)
        else:
            out = tr.pack(pool, [grad[a:b] for a, b in bounds])
            outbox.send(0, {"chunks": len(bounds)}, tr.REQUEST, out, lambda: pool.give(out))
        outbox.send(0, {"pull": True}, tr.REQUEST)
        header, payload = receive(0, tr.REPLY)
        if kind == "pickled":
            for cid, (a, b) in enumerate(bounds):
                mine[a:b].copy_(tr.from_wire(header["params"][cid]))
        else:
            for (a, b), view in zip(bounds, tr.unpack(payload, [(b - a, torch.float32)
                                                              for a, b in bounds])):
                mine[a:b].copy_(view)
            pool.give(payload)
        wait_sent()
        return time.perf_counter() - began

    grad = torch.randn(numel)
    mine = torch.empty(numel)
    for repeat in range(args.repeats + 1):  # the first round of each is a warm-up
        for kind in ("pickled", "buffer"):
            comm.Barrier()
            if comm.Get_rank() == 0:
                serve(kind)
            else:
                elapsed = work(kind, grad, mine)
                if repeat:
                    rows[kind].append(elapsed)
    if comm.Get_rank() == 0:  # the last pull must have returned the server's parameters
        comm.Send([params.numpy(), MPI.FLOAT], dest=1)
    else:
        served = torch.empty(numel)
        comm.Recv([served.numpy(), MPI.FLOAT], source=0)
        check = torch.equal(mine, served)
    end_to_end = optimizer_push_pull(args)  # the server rank serves and exits inside
    table = {kind: {"median_ms": 1000 * statistics.median(times),
                    "min_ms": 1000 * min(times), "runs": len(times)}
             for kind, times in rows.items()}
    speedup = table["pickled"]["median_ms"] / table["buffer"]["median_ms"]
    print(f"push+pull of a {args.model_mb:g} MB model in {len(bounds)} chunks, 1 server + 1 "
          f"worker, {args.repeats} runs each, alternating (medians)")
    for kind, row in table.items():
        print(f"  {kind:<8}{row['median_ms']:>10.1f} ms   (min {row['min_ms']:.1f})")
    print(f"  buffer transport speed-up: {speedup:.2f}x (bar >= 2x); pulled values "
          f"{'match' if check else 'DO NOT match'} the server's")
    print(f"  PSOptimizer step (ASP, 1 server, push + pull): {end_to_end:.1f} ms median")
    if args.json:
        save(args, {"benchmark": "ps transport", "compute": "none (transport only)",
                          "table": table, "speedup": speedup, "values_match": check,
                          "psoptimizer_step_ms": end_to_end})


def optimizer_push_pull(args) -> float:
    """Median ms of ``PSOptimizer.step()`` (ASP, 1 server) on a ``--model-mb`` model."""
    context = start(MPI.COMM_WORLD, Config(ps_servers=1, timeout_s=60), spare=0)
    param = torch.nn.Parameter(torch.zeros(int(args.model_mb * (1 << 20)) // 4))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1e-3), [("w", param)], context, policy="asp")
    param.grad = torch.ones_like(param)
    times = []
    for _ in range(args.repeats + 1):
        began = time.perf_counter()
        ps.step()
        times.append(time.perf_counter() - began)
    ps.join()
    return 1000 * statistics.median(times[1:])
