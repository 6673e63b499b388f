"""Tables, JSON rows and PNG plots of simulated runs; ratios are against the all-reduce
run with the same worker count."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from .engine import RunResult


def rows(results: List[RunResult]) -> List[Dict]:
    """One JSON-ready dict per run, with ratios to all-reduce at the same worker count."""
    base = {r.scenario.workers: r for r in results if r.scenario.mode == "allreduce"}
    out = []
    for r in results:
        s = r.scenario
        ref = base.get(s.workers)
        row = {
            "workers": s.workers, "mode": s.mode, "sim_s": r.sim_s,
            "steps_per_s": r.steps_per_s, "ceiling_steps_per_s": r.ceiling_steps_per_s,
            "fraction_of_ceiling": r.fraction_of_ceiling,
            "time_to_target_s": r.time_to_target_s, "target_loss": s.target_loss,
            "final_loss_average": r.final_loss, "consensus_distance": r.consensus_distance,
            "steps_min": min(r.steps), "steps_max": max(r.steps), "groups": r.groups,
            "mean_group_size": r.mean_group_size, "events": r.events, "wall_s": r.wall_s,
            "throughput_x_allreduce": None, "time_to_target_x_allreduce": None,
        }
        if ref is not None:
            row["throughput_x_allreduce"] = r.steps_per_s / ref.steps_per_s
            row["time_to_target_x_allreduce"] = speedup(ref, r)
        out.append(row)
    return out


def speedup(ref: RunResult, run: RunResult) -> Optional[float]:
    """How many times sooner than ``ref`` the run reached the target. When ``ref`` never
    did, a lower bound from its simulated time (reported as such by the table)."""
    if run.time_to_target_s is None:
        return None
    if ref.time_to_target_s is not None:
        return ref.time_to_target_s / run.time_to_target_s
    return ref.sim_s / run.time_to_target_s


def table(results: List[RunResult]) -> str:
    """A fixed-width table of :func:`rows`."""
    lines = [f"{'workers':>7} {'mode':<10} {'steps/s':>10} {'x allred':>8} {'of ceil':>7} "
             f"{'t->tgt(s)':>10} {'x allred':>8} {'consensus':>9} {'group':>5}"]
    base = {r.scenario.workers: r for r in results if r.scenario.mode == "allreduce"}
    for r, row in zip(results, rows(results)):
        ttt = r.time_to_target_s
        ratio = row["time_to_target_x_allreduce"]
        ref = base.get(r.scenario.workers)
        bound = ">" if ratio is not None and ref is not None and ref.time_to_target_s is None else ""
        lines.append(
            f"{row['workers']:>7} {row['mode']:<10} {row['steps_per_s']:>10.1f} "
            f"{_x(row['throughput_x_allreduce']):>8} {row['fraction_of_ceiling']:>7.0%} "
            f"{(format(ttt, '.2f') if ttt is not None else 'n/a'):>10} "
            f"{bound + _x(ratio):>8} {row['consensus_distance']:>9.2e} "
            f"{row['mean_group_size']:>5.1f}")
    return "\n".join(lines)


def _x(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def scenario_description(result: RunResult) -> Dict:
    """The assumptions of a run (network, topology, compute, speeds, problem) as JSON."""
    return dataclasses.asdict(dataclasses.replace(result.scenario, target_loss=None))


def plot(results: List[RunResult], path: str, title: str) -> Optional[str]:
    """Write a PNG with throughput, time to target, fraction of ceiling and consensus
    distance against the worker count, one line per mode. Returns None on success, or
    why nothing was written (matplotlib missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        return f"no plot: matplotlib is not importable ({err}); pip install matplotlib"
    modes = list(dict.fromkeys(r.scenario.mode for r in results))
    panels = [("steps/s (all workers)", lambda r: r.steps_per_s, True),
              ("time to target (s)", lambda r: r.time_to_target_s, True),
              ("fraction of throughput ceiling", lambda r: r.fraction_of_ceiling, False),
              ("consensus distance", lambda r: r.consensus_distance or None, True)]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, (label, value, log) in zip(axes.flat, panels):
        for mode in modes:
            runs = [r for r in results if r.scenario.mode == mode]
            points = [(r.scenario.workers, value(r)) for r in runs if value(r) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=mode)
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
