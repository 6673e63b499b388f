"""``ripples sim``: simulate the schedules at scale and report throughput, time to target,
fraction of the throughput ceiling and consensus distance per mode and worker count."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ..schedule.base import POLICIES
from . import report
from .network import ALGORITHMS, LINK_SHARING, Link, Network
from .runner import sweep
from .scenario import MODES, TARGET_ON, Scenario
from .stats import Problem
from .workers import SPEED_MODELS, Compute, Speed

# Named settings; any flag given on the command line overrides the preset's value.
PRESETS = {
    # benchmarks/train.py on this 2-core machine: 8 ranks on one node, 50 ms emulated
    # compute, the digits MLP (8,970 float32 parameters); shared-memory link from
    # benchmarks/results/collectives_np4.txt (raw MPI ~5 us small-message latency, ~1.7 GB/s
    # bus bandwidth). The software costs are those measured after 50 ms of sleep, as in
    # training, by benchmarks/latency_after_idle.py (latency_after_idle_np8.json): a
    # P-Reduce of the MLP among 4 of the 8 ranks took 2,763 us (of which the links above
    # account for 62 us), a request to the Group Generator service 1,542 us (10 us). Back
    # to back, ripples adds only ~230 us to a collective (collectives_np4.txt): after a
    # sleep, 8 ranks' threads wake up at once and share 2 cores. These are the costs of
    # the code the validation runs were measured with; since, a generator request takes
    # 764 us (latency_after_idle_np8_client.json), and 2,583 us a P-Reduce. An AD-PSGD
    # exchange, which does not pass through the engine, took 1,829 us (52 us of it the
    # links; latency_after_idle_np8_exchange.json, a later run whose other rows came out up
    # to 16% slower than the one before: that is how much these numbers vary).
    "this-machine": dict(workers_per_node=8, intra_gbps=1.7 * 8, intra_latency_us=5.0,
                         inter_gbps=1.7 * 8, inter_latency_us=5.0,
                         collective_overhead_us=2700.0, service_latency_us=1530.0,
                         exchange_overhead_us=1780.0, step_ms=50.0, model_mb=0.03588,
                         workers="8"),
    # Prague's cluster as the paper describes it: 4 workers per node, 10 GbE between
    # nodes; intra-node PCIe-class links; ResNet-50 (25.6 M float32 parameters, ~12.3 GFLOP
    # per sample forward + backward, batch 32) on a GPU sustaining 4 TFLOP/s (~0.1 s/step).
    "prague": dict(workers_per_node=4, intra_gbps=80.0, intra_latency_us=10.0,
                   inter_gbps=10.0, inter_latency_us=50.0, collective_overhead_us=0.0,
                   flops_per_step=12.3e9 * 32, device_tflops=4.0, model_mb=102.4,
                   workers="64"),
}
DEFAULTS = dict(workers_per_node=8, intra_gbps=2400.0, intra_latency_us=5.0, inter_gbps=100.0,
                inter_latency_us=5.0, collective_overhead_us=0.0, service_latency_us=0.0,
                exchange_overhead_us=0.0, step_ms=100.0, flops_per_step=None,
                device_tflops=None, model_mb=100.0, workers="64,256,1024,4096")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ripples sim", description=__doc__ + """

Every simulated worker runs a real logistic regression (SGD with momentum) and the real
schedule code (the Group Generator on the simulator's clock, static/random partitions,
AD-PSGD pairs). Time to target = simulated seconds until the test loss reaches what
all-reduce reaches after --target-steps synchronous steps. Example:

  ripples sim --preset prague --speed stragglers --stragglers 4 --slow-factor 5 \\
      --modes allreduce,static,generator --json out.json --plot out.png""",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run")
    g.add_argument("--preset", choices=sorted(PRESETS),
                   help="named network/compute/model settings (flags given override them): "
                        + "; ".join(f"{k}" for k in PRESETS))
    g.add_argument("--workers", help="comma-separated worker counts (default 64,256,1024,4096)")
    g.add_argument("--modes", default="allreduce,static,random,generator,adpsgd",
                   help=f"comma-separated modes among {', '.join(MODES)}")
    g.add_argument("--seed", type=int, default=0, help="seed of speeds, data, partitions")
    g = p.add_argument_group("workers")
    g.add_argument("--speed", choices=SPEED_MODELS, default="homogeneous",
                   help="homogeneous; stragglers (the last --stragglers workers --slow-factor "
                        "times slower); random (each step slow with --slow-probability); "
                        "lognormal (fixed per-worker factor exp(--sigma * N(0,1)))")
    g.add_argument("--stragglers", type=int, default=1, help="number of slow workers (stragglers)")
    g.add_argument("--slow-factor", type=float, default=5.0, help="slowdown factor of a slow step")
    g.add_argument("--slow-probability", type=float, default=0.1,
                   help="probability that a step is slow (random)")
    g.add_argument("--sigma", type=float, default=0.5, help="spread of speeds (lognormal)")
    g.add_argument("--step-jitter", type=float, default=0.0,
                   help="every step's time also times exp(JITTER * N(0,1)), drawn per step "
                        "(default 0: identical workers step in exact ties)")
    g.add_argument("--step-ms", type=float, help="measured compute time of one step (ms); "
                   "default 100 unless --flops-per-step and --device-tflops are given")
    g.add_argument("--update-ms", type=float, default=0.0,
                   help="local update of every step (ms), not stretched by a slowdown "
                        "(default 0)")
    g.add_argument("--flops-per-step", type=float, help="FLOPs of one step (forward+backward)")
    g.add_argument("--device-tflops", type=float, help="sustained TFLOP/s of one device")
    g = p.add_argument_group("network (alpha-beta, two levels)")
    g.add_argument("--workers-per-node", type=int, help="workers per node (default 8)")
    g.add_argument("--intra-gbps", type=float, help="intra-node link, Gb/s (default 2400 = NVLink 300 GB/s)")
    g.add_argument("--intra-latency-us", type=float, help="intra-node latency per message (default 5)")
    g.add_argument("--inter-gbps", type=float, help="inter-node link per node, Gb/s (default 100)")
    g.add_argument("--inter-latency-us", type=float, help="inter-node latency per message (default 5)")
    g.add_argument("--inter-pair-gbps", type=float,
                   help="inter-node bandwidth of a two-member collective on two nodes, Gb/s "
                        "(default: --inter-gbps)")
    g.add_argument("--algorithm", choices=ALGORITHMS, default="ring", help="all-reduce algorithm")
    g.add_argument("--link-sharing", choices=LINK_SHARING, default="fixed",
                   help="how collectives crossing a node's inter-node link share it: fixed "
                        "(each at the share it found when it started) or fair (revised as "
                        "others start and end; use with --step-jitter)")
    g.add_argument("--collective-overhead-us", type=float,
                   help="fixed software cost of every collective (default 0)")
    g.add_argument("--service-latency-us", type=float,
                   help="software cost of one request to the Group Generator service beyond "
                        "its two messages (default 0; with --service-jitter, the median)")
    g.add_argument("--service-jitter", type=float, default=0.0,
                   help="spread of each request's cost: service latency x exp(J z), z "
                        "standard normal (default 0: every request costs the same)")
    g.add_argument("--exit-early", type=float, default=0.0,
                   help="members of a collective leave it apart: each leaves d x (x - min x) "
                        "before the last, d its duration, x exponential of this mean (default "
                        "0: all together; benchmarks/exit_spread.py measures it)")
    g.add_argument("--exchange-overhead-us", type=float,
                   help="software cost of one asynchronous AD-PSGD exchange beyond its two "
                        "messages (default 0)")
    g.add_argument("--model-mb", type=float, help="megabytes averaged per collective (default 100)")
    g.add_argument("--overlap", type=float, default=0.0,
                   help="allreduce: fraction of compute the gradient all-reduce overlaps (0-1)")
    g = p.add_argument_group("schedules")
    g.add_argument("--group-size", type=int, default=4, help="group size of random and generator")
    g.add_argument("--policy", choices=POLICIES, default="ready", help="generator division policy")
    g.add_argument("--batch", type=int, default=1, help="groups per generator request")
    g.add_argument("--cross-node-every", type=int, default=4,
                   help="generator-node: every N-th division ignores the nodes")
    g.add_argument("--barrier-every", type=int, default=0,
                   help="static/random/adpsgd-sync: global barrier before every N-th step (0 = never)")
    g = p.add_argument_group("parameter servers (ps-<policy> modes)")
    g.add_argument("--ps-servers", type=int, default=1,
                   help="servers, each holding an equal shard behind its own inter-node link")
    g.add_argument("--staleness", type=int,
                   help="ps-ssp (required), ps-casp (optional): how many pushes a worker "
                        "may lead the slowest; ps-epsp/ps-flexrr: clocks (default 0)")
    g.add_argument("--backup-workers", type=int, default=1,
                   help="ps-syncopt: pushes a round may close without")
    g.add_argument("--communities", default="auto",
                   help="ps-casp: 'auto' (measured progress chooses the count), "
                        "'projected' (the analytic projection chooses it), 'learned' or a "
                        "fixed count")
    g.add_argument("--regroup-every", type=int, default=20,
                   help="ps-casp: rounds between re-forming communities from measured speeds")
    g.add_argument("--tasks-per-clock", type=int,
                   help="ps-epsp/ps-flexrr: micro-batch tasks per clock (default 4 per worker)")
    g.add_argument("--rebalance-every", type=int,
                   help="ps-epsp: clocks between re-dealing shares by speed (default 5)")
    g.add_argument("--push-lr-scale", type=float,
                   help="ps-asp/ps-ssp: learning-rate factor per push (default 1/workers)")
    g = p.add_argument_group("statistical model and measurement")
    g.add_argument("--target-steps", type=int, default=300,
                   help="target loss = what all-reduce reaches after this many steps")
    g.add_argument("--target-on", choices=TARGET_ON, default="average",
                   help="judge the target on worker 0's model or the averaged model")
    g.add_argument("--eval-every", type=int, default=5, help="worker 0's steps between evaluations")
    g.add_argument("--horizon-s", type=float, default=600.0, help="simulated seconds at most")
    g.add_argument("--full-horizon", action="store_true",
                   help="run to --horizon-s even after the target is reached")
    g.add_argument("--dim", type=int, default=32, help="logistic regression dimension")
    g.add_argument("--lr", type=float, default=0.01, help="learning rate")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (local to a worker)")
    g.add_argument("--local-batch", type=int, default=32, help="samples per step per worker")
    g = p.add_argument_group("output")
    g.add_argument("--json", help="write the rows and the assumptions here")
    g.add_argument("--plot", help="write a PNG here (needs matplotlib)")
    g.add_argument("--title", help="plot title")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def scenario_from_args(args) -> tuple:
    """The base :class:`Scenario` and the worker counts the arguments describe."""
    values = dict(DEFAULTS)
    if args.preset:
        values.update(PRESETS[args.preset])
        if PRESETS[args.preset].get("flops_per_step"):
            values["step_ms"] = None
    for key in DEFAULTS:
        given = getattr(args, key, None)
        if given is not None:
            values[key] = given
    if args.flops_per_step is not None or args.device_tflops is not None:
        if args.step_ms is None:
            values["step_ms"] = None
    if values["step_ms"] is not None:
        compute = Compute(step_s=values["step_ms"] / 1e3, update_s=args.update_ms / 1e3)
    else:
        compute = Compute(flops_per_step=values["flops_per_step"],
                          device_flops=(values["device_tflops"] or 0) * 1e12,
                          update_s=args.update_ms / 1e3)
    network = Network(
        workers_per_node=values["workers_per_node"],
        intra=Link(values["intra_latency_us"] * 1e-6, values["intra_gbps"] * 1e9 / 8),
        inter=Link(values["inter_latency_us"] * 1e-6, values["inter_gbps"] * 1e9 / 8),
        algorithm=args.algorithm, overhead_s=values["collective_overhead_us"] * 1e-6,
        service_s=values["service_latency_us"] * 1e-6, service_jitter=args.service_jitter,
        exit_early=args.exit_early,
        exchange_overhead_s=values["exchange_overhead_us"] * 1e-6,
        inter_pair_Bps=None if args.inter_pair_gbps is None else args.inter_pair_gbps * 1e9 / 8,
        link_sharing=args.link_sharing)
    speed = Speed(args.speed, count=args.stragglers, factor=args.slow_factor,
                  probability=args.slow_probability, sigma=args.sigma, jitter=args.step_jitter)
    problem = Problem(dim=args.dim, lr=args.lr, momentum=args.momentum, batch=args.local_batch,
                      margin=10.0, seed=args.seed)
    workers = [int(w) for w in str(values["workers"]).split(",") if w]
    base = Scenario("allreduce", workers[0], compute, speed, network,
                    values["model_mb"] * 1e6, problem, group_size=min(args.group_size, workers[0]),
                    policy=args.policy, batch=args.batch, cross_node_every=args.cross_node_every,
                    seed=args.seed,
                    horizon_s=args.horizon_s, stop_at_target=not args.full_horizon,
                    target_on=args.target_on, eval_every=args.eval_every,
                    barrier_every=args.barrier_every, overlap=args.overlap,
                    ps_servers=args.ps_servers, staleness=args.staleness,
                    backup_workers=args.backup_workers,
                    communities=(args.communities
                                 if args.communities in ("auto", "projected", "learned", "progress")
                                 else _integer("--communities", args.communities)),
                    regroup_every=args.regroup_every, tasks_per_clock=args.tasks_per_clock,
                    rebalance_every=args.rebalance_every, push_lr_scale=args.push_lr_scale)
    return base, workers


def _integer(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag} must be 'auto' or an integer, got {text!r}") from None


def _progress(quiet: bool, horizon: float):
    if quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    def make(label):
        bar = tqdm(total=horizon, desc=label, unit="sim s", leave=False, file=sys.stderr,
                   bar_format="{desc}: {bar} {n:.1f} sim s [{elapsed}]")

        def update(now):
            bar.update(now - bar.n)
        return update
    return make


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"--modes: unknown {bad}; valid: {', '.join(MODES)}")
    try:
        base, workers = scenario_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    for mode in modes:  # each mode's own knobs, checked before anything runs
        try:
            dataclasses.replace(base, mode=mode)
        except ValueError as err:
            parser.error(f"--modes {mode}: {err}")
    net, compute = base.network, base.compute
    print(f"ripples sim: {args.speed} speeds, compute {compute.seconds * 1e3:.1f} ms/step, "
          f"{net.workers_per_node} workers/node, intra {net.intra.bandwidth_Bps * 8 / 1e9:g} Gb/s, "
          f"inter {net.inter.bandwidth_Bps * 8 / 1e9:g} Gb/s ({net.algorithm}), model "
          f"{base.model_bytes / 1e6:g} MB, target = all-reduce loss after {args.target_steps} steps",
          flush=True)
    began = time.perf_counter()
    results = sweep(base, modes, workers, args.target_steps, _progress(args.quiet, args.horizon_s))
    print(report.table(results))
    print(f"({time.perf_counter() - began:.1f} s of simulation)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "command": "ripples sim " + " ".join(argv if argv is not None else sys.argv[2:]),
            "date": time.strftime("%Y-%m-%d %H:%M"), "target_steps": args.target_steps,
            "assumptions": report.scenario_description(results[0]),
            "rows": report.rows(results)}, indent=1, default=str))
    if args.plot:
        why = report.plot(results, args.plot, args.title or f"ripples sim: {args.speed} speeds")
        if why:
            print(why, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
