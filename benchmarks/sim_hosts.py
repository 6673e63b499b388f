"""The simulator against training runs across emulated hosts, its links measured apart.

    python benchmarks/sim_hosts.py --link benchmarks/results/link_hosts4x2_1gbit.json \\
        --compute benchmarks/results/step_spread_hosts4x2_20mb_*.json \\
        --runs benchmarks/results/train_hosts4x2_1gbit_20mb_*.json \\
        --json benchmarks/results/sim_hosts4x2_1gbit.json

Each run of ``benchmarks/train.py --netcluster`` is simulated by ``ripples.sim.validation``
(its rank count, step time, group size, wall time per mode, slowdowns, the ``this-machine``
software costs) with the placement and links of the cluster: ``--workers-per-node`` the
ranks per host, the model's bytes (the MLP plus ``--model-mb``), and the links as
``benchmarks/link.py`` measured them with raw mpi4py, in two calibrations:

* ``pingpong``: latency and bandwidth of a point-to-point message between two hosts and
  within one;
* ``allreduce``: the same, but the inter-host bandwidth is the one at which the network
  model's ring reproduces the measured raw ``MPI.Allreduce`` of all ranks across the hosts
  (TCP through the shaped switch with several flows per link reaches less than a single
  flow);
* ``allreduce_pair`` (where the link file has it): ``allreduce``, and for a group of two
  on two hosts the bandwidth at which the ring reproduces the raw ``MPI.Allreduce``
  between two ranks on two hosts (``--inter-pair-gbps``);
* ``ring`` (where the link file has it): as ``allreduce_pair``, fitted to ripples' ring
  schedule over ``Sendrecv`` (``ring_s``) instead of ``MPI.Allreduce``: what ripples runs
  from 256 KiB across hosts since 2026-11-29; and, where the file has the ring among each
  host's ranks (all hosts at once), the intra-node bandwidth at which the model's ring
  reproduces it, or the ``MPI.Allreduce`` among them below 16 MiB, where ripples does not
  take the ring within a host (the additions and copies share the 2 cores with the other
  ranks: at 20 MB the ring among each host's two ranks is 20-30x slower than the
  ping-pong's bandwidth says);
* ``fair``: the ``ring`` calibration (else ``allreduce_pair``, else ``allreduce``), with the links
  shared fairly for as long as collectives overlap (``--link-sharing fair``) and a 2%
  spread of step times (``--step-jitter 0.02``), which fair sharing needs: without it
  identical workers finish in exact ties.

With ``--compute``, every calibration also takes the step's compute time and its spread
as ``benchmarks/step_spread.py`` measured them with the same ranks and model and no
communication: the emulated compute, the jitter of 8 ranks sharing 2 cores, and the
update of the whole model, which the training runs pay after each collective and which a
slowdown does not stretch.

None of these comes from the training runs. The target (all-reduce steps to the target accuracy)
comes from ``--target-from``, a run of the same MLP, when a run's own all-reduce never
reached it. Rows: median over the runs of measured and simulated throughput per (scenario,
mode, model) and the error of the simulation.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
from pathlib import Path

from harness import report, stats
from ripples.core.config import RING_MIN_BYTES

MLP_MB = 0.03588  # the digits MLP's 8,970 float32 parameters (``ripples sim`` preset)
FAIR_STEP_JITTER = 0.02


def ring_bandwidth(nbytes: float, members: int, seconds: float, latency_s: float) -> float:
    """The link bandwidth at which a ring all-reduce of ``nbytes`` among ``members`` takes
    ``seconds`` (the network model's formula solved for the bandwidth)."""
    steps = 2 * (members - 1)
    return steps * nbytes / members / (seconds - steps * latency_s)


def replaced(flags: list, name: str, value: str) -> list:
    """``flags`` with the value after ``name`` set to ``value``."""
    at = flags.index(name) + 1
    return flags[:at] + [value] + flags[at + 1:]


def calibrations(link: dict) -> dict:
    """``ripples sim`` flags of each calibration, from ``benchmarks/link.py``'s result."""
    inter, intra = link["links"]["inter"], link["links"]["intra"]
    size = len(link["hosts"])
    common = ["--workers-per-node", str(link["ranks_per_host"]),
              "--intra-gbps", f"{intra['gbps']:.4f}",
              "--intra-latency-us", f"{intra['latency_us']:.1f}",
              "--inter-latency-us", f"{inter['latency_us']:.1f}"]
    effective = ring_bandwidth(link["model_mb"] * 1e6, size, link["allreduce_s"]["all ranks"],
                               inter["latency_us"] * 1e-6)
    found = {"pingpong": common + ["--inter-gbps", f"{inter['gbps']:.4f}"],
             "allreduce": common + ["--inter-gbps", f"{effective * 8 / 1e9:.4f}"]}
    pair_s = link["allreduce_s"].get("a pair across hosts")
    if pair_s is not None:
        pair = ring_bandwidth(link["model_mb"] * 1e6, 2, pair_s, inter["latency_us"] * 1e-6)
        found["allreduce_pair"] = found["allreduce"] + ["--inter-pair-gbps",
                                                         f"{pair * 8 / 1e9:.4f}"]
    rings = link.get("ring_s", {})
    if "all ranks" in rings:  # what ripples runs from 256 KiB across hosts
        ring = ring_bandwidth(link["model_mb"] * 1e6, size, rings["all ranks"],
                              inter["latency_us"] * 1e-6)
        found["ring"] = common + ["--inter-gbps", f"{ring * 8 / 1e9:.4f}"]
        if "a pair across hosts" in rings:
            pair = ring_bandwidth(link["model_mb"] * 1e6, 2, rings["a pair across hosts"],
                                  inter["latency_us"] * 1e-6)
            found["ring"] += ["--inter-pair-gbps", f"{pair * 8 / 1e9:.4f}"]
        # Within one host ripples runs the ring from RING_MIN_BYTES, MPI.Allreduce below.
        on_host = (rings if link["model_mb"] * 1e6 >= RING_MIN_BYTES else
                   link["allreduce_s"]).get("each host's ranks, all hosts at once")
        if on_host is not None and link["ranks_per_host"] > 1:
            host = ring_bandwidth(link["model_mb"] * 1e6, link["ranks_per_host"], on_host,
                                  intra["latency_us"] * 1e-6)
            found["ring"] = replaced(found["ring"], "--intra-gbps", f"{host * 8 / 1e9:.4f}")
    found["fair"] = list(found.get("ring", found.get("allreduce_pair", found["allreduce"]))) + [
        "--link-sharing", "fair", "--step-jitter", str(FAIR_STEP_JITTER)]
    return found


def median_link(links: list) -> dict:
    """One ``benchmarks/link.py`` result from several runs on the same cluster: the median
    of each link's latency and bandwidth and of each all-reduce time present in every run."""
    first = links[0]
    for other in links[1:]:
        if (other["hosts"], other["model_mb"]) != (first["hosts"], first["model_mb"]):
            raise SystemExit("--link: the files describe different clusters or payloads")
    merged = {**first, "links": {}, "allreduce_s": {}, "ring_s": {}}
    for name in first["links"]:
        merged["links"][name] = {key: stats.median([link["links"][name][key] for link in links])
                                 for key in ("latency_us", "bandwidth_Bps", "gbps")}
    for kind in ("allreduce_s", "ring_s"):
        for name in first.get(kind, {}):
            if all(name in link.get(kind, {}) for link in links):
                merged[kind][name] = stats.median([link[kind][name] for link in links])
    return merged


def compute_flags(spreads: list) -> list:
    """``ripples sim`` flags of the step as ``benchmarks/step_spread.py`` measured it (the
    medians of several runs): the padded compute, the spread of its time from rank to rank
    and step to step, and the update after it."""
    return [flag for key, flag in (("step_ms", "--step-ms"), ("step_jitter", "--step-jitter"),
                                   ("update_ms", "--update-ms"))
            for flag in (flag, f"{stats.median(s[key] for s in spreads):.4f}")]


def compare_runs(runs: list, steps: int, flags: dict, seeds=(), sim_flags=()) -> list:
    """One row per (model, scenario, mode) of the training ``runs``: the median measured
    steps per second, and per calibration of ``flags`` the median simulated one over the
    runs and ``seeds`` (none: each run's own seed), its error and, with several seeds, the
    error's range; members per collective likewise."""
    from ripples.sim.validation import compare

    seeds = [["--seed", str(seed)] for seed in seeds] or [[]]
    first = next(iter(flags))
    per_row: dict = {}
    for run in runs:
        model = ["--model-mb", str(MLP_MB + run["args"]["model_mb"]), *sim_flags]
        for (name, extra), seed in itertools.product(flags.items(), seeds):
            for row in compare(run, extra + model + seed, steps=steps):
                key = (run["args"]["model_mb"], row["scenario"], row["mode"])
                entry = per_row.setdefault(key, {"measured": [], "sim": {}, "group": [],
                                                 "sim_group": {}})
                if name == first and seed == seeds[0]:
                    entry["measured"].append(row["measured_steps_per_s"])
                    if row["measured_mean_group_size"] is not None:
                        entry["group"].append(row["measured_mean_group_size"])
                entry["sim"].setdefault(name, []).append(row["sim_steps_per_s"])
                entry["sim_group"].setdefault(name, []).append(row["sim_mean_group_size"])
    rows = []
    for (padding, scenario, mode), entry in per_row.items():
        measured = stats.median(entry["measured"])
        row = {"model_mb": MLP_MB + padding, "scenario": scenario, "mode": mode,
               "runs": len(entry["measured"]),
               "measured_steps_per_s": measured}
        for name, values in entry["sim"].items():
            row[f"sim_{name}_steps_per_s"] = stats.median(values)
            row[f"error_{name}"] = stats.median(values) / measured - 1
            if len(seeds) > 1:
                row[f"error_{name}_range"] = [min(values) / measured - 1,
                                              max(values) / measured - 1]
        # members per collective, measured and simulated (medians over the runs)
        row["measured_mean_group_size"] = (stats.median(entry["group"]) if entry["group"]
                                           else None)
        for name, values in entry["sim_group"].items():
            row[f"sim_{name}_mean_group_size"] = stats.median(values)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--link", nargs="+", required=True,
                        help="benchmarks/link.py's JSON (several: their medians)")
    parser.add_argument("--runs", nargs="+", required=True, help="train.py --netcluster JSONs")
    parser.add_argument("--target-from", default=str(Path(__file__).parent / "results" /
                                                     "train_np8.json"),
                        help="run whose homogeneous all-reduce gives the target in steps")
    parser.add_argument("--compute", nargs="+",
                        help="benchmarks/step_spread.py's JSON for the runs' model (several: "
                             "their medians): every calibration then takes its measured step "
                             "time and spread (--step-ms, --step-jitter) instead of the "
                             "emulated compute alone")
    parser.add_argument("--sim-flags", default="",
                        help="more ripples sim flags for every calibration, e.g. "
                             "--sim-flags='--step-jitter 0.02'")
    parser.add_argument("--seeds", default="",
                        help="comma-separated simulator seeds, each run simulated with every "
                             "one (rows: the median over runs and seeds, and the range of "
                             "the error); default: each run's own seed")
    parser.add_argument("--json", help="write the comparison here")
    args = parser.parse_args(argv)
    from ripples.sim.validation import target_steps

    link = median_link([json.loads(Path(path).read_text()) for path in args.link])
    steps = target_steps(json.loads(Path(args.target_from).read_text()))
    flags = calibrations(link)
    if args.compute:
        step = compute_flags([json.loads(Path(path).read_text()) for path in args.compute])
        flags = {name: calibration + step for name, calibration in flags.items()}
    rows = compare_runs([json.loads(Path(path).read_text()) for path in args.runs],
                        steps, flags, [seed for seed in args.seeds.split(",") if seed],
                        shlex.split(args.sim_flags))
    print(f"{'model MB':>8} {'scenario':<12} {'mode':<15} {'measured':>8} " +
          " ".join(f"{'sim ' + n:>14} {'error':>6}" for n in flags) +
          "   members per collective: measured, " + ", ".join(f"sim {n}" for n in flags))
    for r in rows:
        group = r["measured_mean_group_size"]
        print(f"{r['model_mb']:>8.2f} {r['scenario']:<12} {r['mode']:<15} "
              f"{r['measured_steps_per_s']:>8.1f} " +
              " ".join(f"{r[f'sim_{n}_steps_per_s']:>14.1f} {r[f'error_{n}']:>+6.0%}"
                       for n in flags) +
              f"   {'-' if group is None else format(group, '.2f')}, " +
              ", ".join(f"{r[f'sim_{n}_mean_group_size']:.2f}" for n in flags))
    if args.json:
        report.write_json(args.json, {"link": args.link, "runs": args.runs,
                                      "compute": args.compute,
                                      "sim_flags": args.sim_flags, "seeds": args.seeds,
                                      "target_steps": steps, "calibrations": flags,
                                      "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
