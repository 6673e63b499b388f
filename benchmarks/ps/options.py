"""The command line of ``benchmarks/ps.py``, which mode it asks for, and the job each mode
runs in (ranks, environment)."""
from __future__ import annotations

import argparse

# The ranks of each mode's job (servers + spare + workers).
RANKS = {"policies": 5, "scenarios": 9, "transport": 2, "psld": 7, "budget": 9}
# The scenarios of --scenarios (--only names some of them), in the order they run.
SCENARIOS = ("classes", "one_slow", "random")


def parse(description: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
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
    parser.add_argument("--budget", action="store_true",
                        help="digits MLP, 8 workers (4-7 slow) + 1 server, --seconds per policy")
    parser.add_argument("--sweep", action="store_true",
                        help="--budget's setup over --ratios x --shares x --widths, every policy")
    parser.add_argument("--batch", type=int, default=32, help="--budget/--sweep: samples per step")
    parser.add_argument("--mlp-lr", type=float, default=0.05, help="--budget/--sweep: BSP's lr")
    parser.add_argument("--hidden", type=int, default=64, help="--budget: the MLP's width")
    parser.add_argument("--casp-regroup", type=int, default=5,
                        help="--budget/--sweep: the CASP rows' regroup_every")
    parser.add_argument("--no-loss-reports", action="store_true",
                        help="--budget/--sweep: the loop does not call report_loss")
    parser.add_argument("--ratios", default="1.5,3,10", help="--sweep: slowdowns of the slow")
    parser.add_argument("--shares", default="1,4", help="--sweep: how many of 8 are slow")
    parser.add_argument("--widths", default="64", help="--sweep: MLP widths (model size)")
    parser.add_argument("--sweep-repeats", type=int, default=1,
                        help="--sweep: runs of every row per setting, interleaved; the "
                             "summary gives their medians")
    parser.add_argument("--sim-sweep", action="store_true",
                        help="the policies in the simulator (no MPI), see ps/sim_sweep.py")
    parser.add_argument("--sim-workers", default="32,256")
    parser.add_argument("--sim-shares", default="0.125,0.5", help="fraction of slow workers")
    parser.add_argument("--sim-model-mb", default="0.04,100")
    parser.add_argument("--sim-gbps", type=float, default=10.0, help="server link")
    parser.add_argument("--sim-step-ms", type=float, default=100.0)
    parser.add_argument("--sim-batch", type=int, default=32, help="samples per step")
    parser.add_argument("--sim-lr", type=float, default=0.05)
    parser.add_argument("--sim-target", type=float, default=0.35, help="test loss")
    parser.add_argument("--sim-horizon", type=float, default=600.0)
    parser.add_argument("--sim-regroup", type=int, default=5)
    return parser.parse_args(argv)




def mode(args) -> str:
    """The mode the flags ask for (the first of ``--scenarios``, ``--transport``,
    ``--psld``, ``--budget``/``--sweep``; else the policies comparison)."""
    for name in ("scenarios", "transport", "psld"):
        if getattr(args, name):
            return name
    if args.budget or args.sweep:
        return "budget"
    if args.sim_sweep:
        return "sim_sweep"
    return "policies"


def job_env(name: str, args) -> dict:
    """The environment a mode's job adds: ``--psld`` has a spare rank and slows server 1."""
    if name != "psld":
        return {}
    return {"RIPPLES_PS_SPARE": "1", "RIPPLES_SERVER_SLOWDOWN": f"1:{args.server_slow:g}",
            "RIPPLES_SERVER_COST": args.server_cost}
