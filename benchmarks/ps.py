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

``--transport`` (2 ranks: a server and a worker): push + pull of a ``--model-mb`` model
(default 64 MB in 4 MB chunks), the pickled messages the servers used before (numpy arrays
inside pickled dicts, with their copies, rebuilt here from the same helpers) against the
buffer transport (header + raw bytes into pooled buffers); the server applies the same
SGD step in both. Then ``PSOptimizer`` itself (1 server, ASP) for the end-to-end time.

    python benchmarks/ps.py --transport --json benchmarks/results/ps_transport.json

``--psld`` (2 servers + 1 spare + 4 workers, ``mpiexec -n 7``): BSP with emulated compute
(``--compute-ms`` of sleep per step), server 1 slowed ``--server-slow``x by
``RIPPLES_SERVER_SLOWDOWN`` (service cost ``--server-cost``, see ``ripples.ps.slowness``).
Rows: every static placement (TensorFlow round-robin, MXNet, BytePS hash, greedy by bytes)
on the 2 servers, PSLD, PSLD without exploration. Each row reports the median iteration
time, per-server load max/mean (servers' busy time over iterations 40-50 when the run is
that long, else over its second half), migrations, rollbacks, bytes moved, and the
exactly-once check (every chunk updated once per round, one owner, checksums equal).

    python benchmarks/ps.py --psld --json benchmarks/results/ps_psld.json
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
TRANSPORT_RANKS = 2
PSLD_RANKS = 7


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
    parser.add_argument("--transport", action="store_true",
                        help="pickled vs buffer push+pull of one model (2 ranks)")
    parser.add_argument("--model-mb", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--psld", action="store_true",
                        help="static placements vs PSLD with one slow server (7 ranks)")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--psld-mb", type=float, default=12.0, help="model size for --psld")
    parser.add_argument("--server-slow", type=float, default=3.0)
    parser.add_argument("--server-cost", default="0.2:1",
                        help="emulated server service cost FIXED_MS:NS_PER_BYTE")
    parser.add_argument("--psld-window", type=int, default=4)
    return parser.parse_args()


def relaunch(ranks: int = RANKS, extra_env=None) -> int:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", **(extra_env or {}))
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
    ("CASP(learned)", "casp", {"communities": "learned", "regroup_every": 10}),
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
            record["server"]["claims"] = board.get("claims")  # claim requests, all workers
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

    from ripples.core.config import Config
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


# -- transport (--transport) -----------------------------------------------------------------
def transport_main(args):
    """Rank 0 serves, rank 1 pushes and pulls; both ways in one run, alternating."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from ripples.ps import transport as tr

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
        write_json(args, {"benchmark": "ps transport", "compute": "none (transport only)",
                          "table": table, "speedup": speedup, "values_match": check,
                          "psoptimizer_step_ms": end_to_end})


def optimizer_push_pull(args) -> float:
    """Median ms of ``PSOptimizer.step()`` (ASP, 1 server) on a ``--model-mb`` model."""
    import torch
    from mpi4py import MPI

    from ripples.core.config import Config
    from ripples.ps import start
    from ripples.ps.optimizer import PSOptimizer

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


# -- PSLD (--psld) ---------------------------------------------------------------------------
PSLD_ROWS = [("static roundrobin (TensorFlow)", "roundrobin", None),
             ("static mxnet", "mxnet", None), ("static hash (BytePS)", "hash", None),
             ("static greedy (bytes)", "greedy", None),
             ("PSLD", "roundrobin", {"explore": True}),
             ("PSLD without exploration", "roundrobin", {"explore": False})]
# Tensor sizes as fractions of the model: a few large layers and a tail of small ones.
PSLD_SHAPE = [0.30, 0.18, 0.12, 0.10, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01, 0.01]


def psld_row(context, args, row, placement, options):
    """One BSP session of ``args.iterations`` steps; worker 0 returns the row."""
    import torch
    from ripples.ps import psld
    from ripples.ps.optimizer import PSOptimizer

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
    rids = {s: ps.channel.send(s, {"kind": "stats", "sid": ps.sid, "w": ps.worker})
            for s in ps.servers}
    return {s: ps.channel.wait(s, rid, 120, "stats")["stats"] for s, rid in rids.items()}


def psld_main(args):
    from mpi4py import MPI

    from ripples.core.config import Config
    from ripples.ps import start

    context = start(MPI.COMM_WORLD, Config.load(ps_servers=2, timeout_s=120))
    if context.num_workers != 4 or context.spare != 1:
        raise SystemExit(f"run with {PSLD_RANKS} ranks: 2 servers + 1 spare + 4 workers")
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
        write_json(args, {"benchmark": "ps psld", "compute": "emulated (sleep per step)",
                          "table": table, "bars": lines})


def write_json(args, result):
    result.update({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
                   "command": "python benchmarks/ps.py " + " ".join(sys.argv[1:]),
                   "args": vars(args)})
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))


def main():
    args = parse()
    if "OMPI_COMM_WORLD_SIZE" not in os.environ and "PMI_SIZE" not in os.environ:
        if args.psld:
            sys.exit(relaunch(PSLD_RANKS, {
                "RIPPLES_PS_SPARE": "1", "RIPPLES_SERVER_SLOWDOWN": f"1:{args.server_slow:g}",
                "RIPPLES_SERVER_COST": args.server_cost}))
        sys.exit(relaunch(TRANSPORT_RANKS if args.transport else
                          SCENARIO_RANKS if args.scenarios else RANKS))
    if args.scenarios:
        scenarios_main(args)
        return
    if args.transport:
        transport_main(args)
        return
    if args.psld:
        psld_main(args)
        return
    from mpi4py import MPI

    from ripples.core.config import Config
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
