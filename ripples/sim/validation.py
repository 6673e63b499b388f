"""The simulator against measured runs of ``benchmarks/train.py`` (its ``--json`` report).

Each measured scenario is simulated with what the benchmark did: its rank count, emulated
step time, group size, wall time per mode and slowdowns, the ``this-machine`` preset
(links from the collectives benchmark, software costs from
``benchmarks/latency_after_idle.py``; none from these runs), and the global stop check
every 10 steps that the benchmark runs in the static, random and lock-step AD-PSGD modes. The
benchmark trains an MLP on digits, the simulator a logistic regression, so one number is
taken from the measurements: the target is the loss all-reduce reaches after as many steps
as the measured homogeneous all-reduce run needed to reach its target accuracy. Every
other time to target, and every throughput, is a prediction.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .cli import build_parser, scenario_from_args
from .runner import run_modes

# benchmarks/train.py's mode names -> the simulator's.
MODE_NAMES = {"allreduce": "allreduce", "ripples/static": "static", "ripples/random": "random",
              "ripples/generator": "generator", "ripples/generator-node": "generator-node",
              "adpsgd": "adpsgd", "adpsgd-sync": "adpsgd-sync"}
SPEED_FLAGS = {"homogeneous": [], "one-slow": ["--speed", "stragglers", "--stragglers", "1",
                                               "--slow-factor", "5"],
               "random-slow": ["--speed", "random", "--slow-probability", "0.1",
                               "--slow-factor", "5"]}
STOP_CHECK_EVERY = 10  # demo.train_mode's _time_is_up: an all-reduce every 10 steps


def target_steps(report: Dict) -> int:
    """Per-worker steps the measured homogeneous all-reduce run took to its target."""
    row = next(r for r in report["scenarios"]["homogeneous"]["modes"] if r["mode"] == "allreduce")
    return max(1, round(row["time_to_target_s"] * row["steps_per_s"] / report["args"]["np"]))


def compare(report: Dict, extra_flags: Sequence[str] = (),
            steps: Optional[int] = None) -> List[Dict]:
    """One row per measured (scenario, mode): measured and simulated throughput and time to
    target, and their ratios (simulated / measured). ``extra_flags``: ``ripples sim`` flags
    applied on top, e.g. the software costs measured for the code a run used, or the links
    and placement of a run across hosts. ``steps``: the target in all-reduce steps, default
    ``target_steps(report)`` (give it when that run's all-reduce never reached its target:
    the same model's from another run)."""
    args = report["args"]
    steps = target_steps(report) if steps is None else steps
    out = []
    for scenario, measured in report["scenarios"].items():
        by_mode = {MODE_NAMES[r["mode"]]: r for r in measured["modes"] if r["mode"] in MODE_NAMES}
        flags = ["--preset", "this-machine", "--workers", str(args["np"]),
                 "--workers-per-node", str(args["np"]), "--step-ms", str(args["compute_ms"]),
                 "--group-size", str(args["group_size"]), "--seed", str(args["seed"]),
                 "--target-on", "worker0", "--full-horizon",
                 "--barrier-every", str(STOP_CHECK_EVERY)]
        flags += SPEED_FLAGS[scenario] + list(extra_flags)
        for mode, row in by_mode.items():
            base, _ = scenario_from_args(build_parser().parse_args(
                flags + ["--horizon-s", str(row["wall_s"])]))
            (sim,) = run_modes(base, [mode], target_steps=steps)
            out.append({
                "scenario": scenario, "mode": mode,
                "measured_steps_per_s": row["steps_per_s"], "sim_steps_per_s": sim.steps_per_s,
                "throughput_ratio": sim.steps_per_s / row["steps_per_s"],
                "measured_time_to_target_s": row["time_to_target_s"],
                "sim_time_to_target_s": sim.time_to_target_s, "wall_s": row["wall_s"],
                # members per collective (runs before 2026-11-27 did not record it)
                "measured_mean_group_size": row.get("mean_group_size"),
                "sim_mean_group_size": sim.mean_group_size,
                "time_to_target_ratio": (sim.time_to_target_s / row["time_to_target_s"]
                                         if sim.time_to_target_s and row["time_to_target_s"]
                                         else None)})
    return out


def markdown(rows: List[Dict]) -> str:
    """The comparison as a Markdown table."""
    def t(v):
        return "not reached" if v is None else f"{v:.1f}"
    lines = ["| scenario | mode | steps/s measured | simulated | ratio | time to target measured (s) | simulated (s) | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["time_to_target_ratio"]
        lines.append(f"| {r['scenario']} | {r['mode']} | {r['measured_steps_per_s']:.1f} | "
                     f"{r['sim_steps_per_s']:.1f} | {r['throughput_ratio']:.2f} | "
                     f"{t(r['measured_time_to_target_s'])} | {t(r['sim_time_to_target_s'])} | "
                     f"{'-' if ratio is None else format(ratio, '.2f')} |")
    return "\n".join(lines)
