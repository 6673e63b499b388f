"""End-to-end benchmark: all-reduce vs decentralized modes under heterogeneity.

    python benchmarks/train.py --np 8 --seconds 15 --json benchmarks/results/train.json

For each scenario (homogeneous; one 5x-slow worker; random 5x slowdowns with p = 0.1) one
MPI job of ``--np`` ranks trains the same model (an MLP on scikit-learn's digits), data,
seed and wall-clock budget in every mode: ``allreduce``, ``ripples`` with the static,
random and generator schedules, ``adpsgd`` (asynchronous AD-PSGD) and ``adpsgd-sync`` (its
pairs in lock-step); then PyTorch DDP (gloo) as an outside
reference (its "wait" is the whole backward pass, which contains its all-reduce; Horovod's
row is in ``epochs.py``, the script users write). Compute is EMULATED: each step is padded to
``--compute-ms`` (sleep) so that 8 ranks on 2 cores measure synchronization, not CPU
contention. Ratios are against ``allreduce`` in the same job. ``--modes`` runs a subset
(``allreduce`` always runs, as the reference).

Across hosts: ``--netcluster`` starts the job on the emulated cluster of ``netcluster up``
(ranks fill its hosts slot by slot, links shaped as it says; ``ripples/static`` and
``ripples/generator-node`` group the ranks of a host first), and ``--model-mb`` adds one
parameter of that many megabytes to the MLP (unused by the forward pass but for a zero
term) so that every all-reduce, P-Reduce and exchange carries a bandwidth-bound payload:
communication real, compute emulated.

    netcluster up 4 --slots 2 --bw 1gbit
    python benchmarks/train.py --netcluster --model-mb 20 --seconds 15 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

from harness import launch, report, stats

SCENARIOS = {
    "homogeneous": {},
    "one-slow": {"slowdown": "{last}:5"},
    "random-slow": {"random_slowdown": "0.1:5"},
}
MODES = [("allreduce", None), ("ripples", "static"), ("ripples", "random"),
         ("ripples", "generator"), ("ripples", "generator-node"), ("adpsgd", None),
         ("adpsgd-sync", None)]


def mode_name(sync: str, schedule) -> str:
    return sync if schedule is None else f"{sync}/{schedule}"


MODE_NAMES = [mode_name(*m) for m in MODES] + ["ddp"]
ALIASES = {"ripples": "ripples/generator", "static": "ripples/static",
           "random": "ripples/random", "generator": "ripples/generator",
           "generator-node": "ripples/generator-node"}


def selected_modes(text: str) -> list:
    """The mode names of ``--modes`` (aliases resolved), in benchmark order, allreduce first."""
    asked = {ALIASES.get(m.strip(), m.strip()) for m in text.split(",") if m.strip()}
    unknown = sorted(asked - set(MODE_NAMES))
    if unknown:
        raise ValueError(f"--modes: unknown {unknown}; valid: {MODE_NAMES} or {sorted(ALIASES)}")
    return [m for m in MODE_NAMES if m in asked or m == "allreduce"]


def ceiling_steps_per_s(size: int, compute_ms: float, scenario: str) -> float:
    """sum_i v_i: every worker stepping at its own speed with no waiting at all."""
    t = compute_ms / 1000.0
    if scenario == "one-slow":
        return (size - 1) / t + 1 / (5 * t)
    if scenario == "random-slow":
        return size / (t * (0.9 + 0.1 * 5))
    return size / t


def worker(args) -> None:
    import ripples.torch as hvd
    from ripples.demo import load_data, train_mode

    if args.model_mb:
        from padded import pad_models
        pad_models(args.model_mb)
    scenario = SCENARIOS[args.scenario]
    settings = {k: v.format(last=args.np - 1) for k, v in scenario.items()}
    hvd.init(compute_ms=args.compute_ms, seed=args.seed, **settings)
    data = load_data()
    rows = []
    wanted = selected_modes(args.modes)
    for sync, schedule in MODES:
        if mode_name(sync, schedule) not in wanted:
            continue
        result = train_mode(data, sync, args.seconds, batch=args.batch, lr=args.lr,
                            target=args.target, schedule=schedule, group_size=args.group_size,
                            progress=False, seed=args.seed)
        rows.append({
            "mode": result.mode,
            "wall_s": result.wall_s,
            "steps_per_s": sum(result.steps) / result.wall_s,
            "samples_per_s": result.samples_per_s,
            "steps_min": min(result.steps), "steps_max": max(result.steps),
            "time_to_target_s": result.time_to_target_s,
            "averaged_accuracy": result.averaged_accuracy,
            "worst_accuracy": result.worst_accuracy,
            "consensus_distance": result.consensus_distance,
            "wait_share": sum(result.wait_s) / (len(result.wait_s) * result.wall_s),
            "mean_group_size": result.mean_group_size or None,  # None: no groups recorded
            "groups_by_size": {str(k): v for k, v in result.groups_by_size.items()},
            "request_cost_ms": result.request_cost_ms,
            "division_reasons": result.division_reasons,  # rank 0's generator
            "generator_events": result.generator_events,  # rank 0's generator
        })
        if hvd.rank() == 0:
            print(f"  {args.scenario}: {result.mode} done", file=sys.stderr, flush=True)
    if "ddp" in wanted:
        rows.append(train_ddp(data, args))
    if hvd.rank() == 0:
        Path(args.out).write_text(json.dumps(rows))
    hvd.shutdown()


def train_ddp(data, args) -> dict:
    """The same model, data and budget with PyTorch DDP over gloo: an outside reference."""
    import torch
    import torch.distributed as dist

    import ripples.torch as hvd
    from ripples.demo import accuracy, make_model
    from ripples.core.heterogeneity import SlowdownInjector
    from ripples.runtime import current

    if not dist.is_available():
        return {"mode": "ddp (gloo)", "note": "torch.distributed not available"}
    rank, size = hvd.rank(), hvd.size()
    # Across hosts gloo's rendezvous must be reachable: rank 0's host address.
    address = "127.0.0.1"
    if hvd.local_size() != size:
        address = socket.gethostbyname(socket.gethostname())
    address, port = hvd.broadcast_object(
        (address, launch.free_port(address)) if rank == 0 else None, 0)
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=size)
    model = make_model(data.x_train.shape[1], data.classes, args.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    injector = SlowdownInjector.from_config(current().config, rank, size)
    shard_x, shard_y = data.x_train[rank::size], data.y_train[rank::size]
    generator = torch.Generator().manual_seed(args.seed + rank)
    curve_hit, steps, wait = None, 0, 0.0
    hvd.barrier()
    start = time.perf_counter()
    while True:
        if steps % 10 == 0:  # DDP needs equal step counts: stop on the slowest clock
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if elapsed.item() >= args.seconds:
                break
        index = torch.randint(len(shard_x), (args.batch,), generator=generator)
        optimizer.zero_grad()
        began = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(shard_x[index]), shard_y[index])
        injector.finish_step(time.perf_counter() - began)  # pad/slow before the all-reduce
        began = time.perf_counter()
        loss.backward()  # DDP all-reduces gradients here
        wait += time.perf_counter() - began
        optimizer.step()
        steps += 1
        if rank == 0 and curve_hit is None and steps % 5 == 0:
            if accuracy(model, data.x_test, data.y_test) >= args.target:
                curve_hit = time.perf_counter() - start
    wall = time.perf_counter() - start
    acc = accuracy(model, data.x_test, data.y_test)
    dist.destroy_process_group()
    stats = hvd.allgather_object((steps, wait))
    return {"mode": "ddp (gloo)", "wall_s": wall, "steps_per_s": sum(s[0] for s in stats) / wall,
            "samples_per_s": sum(s[0] for s in stats) * args.batch / wall,
            "steps_min": min(s[0] for s in stats), "steps_max": max(s[0] for s in stats),
            "time_to_target_s": curve_hit, "averaged_accuracy": acc, "worst_accuracy": acc,
            "consensus_distance": 0.0,
            "wait_share": sum(s[1] for s in stats) / (len(stats) * wall)}


def run_scenario(args, scenario: str, out: str) -> None:
    """One MPI job of ``args.np`` ranks: every selected mode in ``scenario``; rank 0 writes
    the rows to ``out``."""
    command = launch.script_command(
        __file__, "--worker", "--scenario", scenario, "--out", out, "--np", args.np,
        "--seconds", args.seconds, "--compute-ms", args.compute_ms, "--batch", args.batch,
        "--lr", args.lr, "--target", args.target, "--group-size", args.group_size,
        "--seed", args.seed, "--modes", args.modes, "--model-mb", args.model_mb)
    modes = len(selected_modes(args.modes))
    launch.run_job(args.np, command, timeout=60 + 3 * args.seconds * modes,
                   across_hosts=args.netcluster)


def time_to_target_ratio(base: dict, ttt) -> str:
    """How much sooner than all-reduce the target was reached; when all-reduce never
    reached it, a lower bound from its whole wall time."""
    if not ttt:
        return "n/a"
    if base["time_to_target_s"]:
        return f"{stats.ratio(base['time_to_target_s'], ttt):.2f}x"
    return f">{stats.ratio(base['wall_s'], ttt):.2f}x"


def table(scenario: str, rows, ceiling: float) -> str:
    base = rows[0]
    lines = [f"scenario {scenario}: ceiling {ceiling:.1f} steps/s",
             f"{'mode':<22} {'steps/s':>8} {'x allred':>8} {'of ceil':>7} {'t->tgt(s)':>9} "
             f"{'x allred':>8} {'avg acc':>7} {'worst':>6} {'consensus':>9} {'wait':>5}"]
    for row in rows:
        if "steps_per_s" not in row:
            lines.append(f"{row['mode']:<22} {row.get('note', 'not run')}")
            continue
        ttt = row["time_to_target_s"]
        speed = time_to_target_ratio(base, ttt)
        lines.append(
            f"{row['mode']:<22} {row['steps_per_s']:>8.1f} "
            f"{stats.ratio(row['steps_per_s'], base['steps_per_s']):>7.2f}x "
            f"{stats.ratio(row['steps_per_s'], ceiling):>7.0%} "
            f"{(format(ttt, '.1f') if ttt else 'n/a'):>9} "
            f"{speed:>8} "
            f"{row['averaged_accuracy']:>7.3f} {row['worst_accuracy']:>6.3f} "
            f"{row['consensus_distance']:>9.2e} {row['wait_share']:>5.0%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0, help="wall time per mode")
    parser.add_argument("--compute-ms", type=float, default=50.0, help="emulated compute per step")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--target", type=float, default=0.93, help="target test accuracy")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {list(SCENARIOS)}")
    parser.add_argument("--modes", default=",".join(MODE_NAMES),
                        help=f"comma-separated, of {MODE_NAMES} (or {sorted(ALIASES)}); "
                             "allreduce always runs")
    parser.add_argument("--model-mb", type=float, default=0.0,
                        help="add a parameter of this many MB to the model (0: the MLP alone)")
    parser.add_argument("--netcluster", action="store_true",
                        help="run on the emulated cluster of 'netcluster up' (from h1)")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"--scenarios: unknown {unknown}; valid: {list(SCENARIOS)}")
    try:
        selected_modes(args.modes)
    except ValueError as exc:
        parser.error(str(exc))
    model = "digits MLP" + (f" + {args.model_mb:g} MB parameter" if args.model_mb else "")
    print(f"end-to-end benchmark: {args.np} ranks on {os.cpu_count()} cores, compute EMULATED "
          f"({args.compute_ms:g} ms/step), communication real, {args.seconds:g} s per mode, "
          f"group size {args.group_size}, {model}, {time.strftime('%Y-%m-%d')}")
    result = {"compute": "emulated", "communication": "real", "model": model,
              "args": vars(args), "scenarios": {}}
    if args.netcluster:
        result["cluster"] = launch.cluster_status()
        print(result["cluster"])
    for scenario in scenarios:
        out = f"/tmp/ripples_train_{scenario}_{os.getpid()}.json"
        run_scenario(args, scenario, out)
        rows = json.loads(Path(out).read_text())
        ceiling = ceiling_steps_per_s(args.np, args.compute_ms, scenario)
        result["scenarios"][scenario] = {"ceiling_steps_per_s": ceiling, "modes": rows}
        print(table(scenario, rows, ceiling), flush=True)
    if args.json:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
