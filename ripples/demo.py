"""The ripples demo: the same model trained with all-reduce and with ripples, one rank slowed.

    ripplesrun -np 4 --slowdown 3:4 python -m ripples.demo

Each mode trains for the same wall-clock budget on scikit-learn's bundled digits data (or
``--data file.npz`` with arrays ``x`` and ``y``). Rank 0 shows progress, then prints a table
(mode, wall time, samples/s over all ranks, time until rank 0's model reaches the target
accuracy, accuracy of the averaged model) and saves a plot of accuracy against wall time.
Compute is real, padded to ``--compute-ms`` per step (emulated compute) unless
``RIPPLES_COMPUTE_MS`` / ``ripplesrun --compute-ms`` says otherwise.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

import ripples.torch as hvd
from ripples.core.config import Config
from ripples.core.distribution import pip_install
from ripples.observe import metrics
from ripples.observe.progress import progress_bar


@dataclass
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def _demo_dependency(module: str, package: str):
    """Import ``module`` of the demo's extra, or raise ImportError saying how to install it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"the demo needs {package}: {pip_install('demo')}") from exc


def load_data(path: Optional[str] = None, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Digits (bundled with scikit-learn) or an ``.npz`` file with ``x`` (samples first) and
    integer labels ``y``. Raises ValueError naming the file and the problem."""
    if path is None:
        load_digits = _demo_dependency("sklearn.datasets", "scikit-learn").load_digits
        bundle = load_digits()
        x, y = bundle.data / 16.0, bundle.target
    else:
        if not os.path.isfile(path):
            raise ValueError(f"--data {path!r}: no such file; pass an .npz file with arrays x and y")
        try:
            with np.load(path, allow_pickle=False) as archive:
                missing = {"x", "y"} - set(archive.files)
                if missing:
                    raise ValueError(f"--data {path!r} lacks array(s) {sorted(missing)}; it has "
                                     f"{sorted(archive.files)}")
                x, y = archive["x"], archive["y"]
        except (OSError, ValueError) as exc:
            if isinstance(exc, ValueError) and str(exc).startswith("--data"):
                raise
            raise ValueError(f"--data {path!r} is not a readable .npz file ({exc})") from None
        if len(x) != len(y) or len(x) < 10:
            raise ValueError(f"--data {path!r}: x has {len(x)} samples and y {len(y)}; they must "
                             "match and hold at least 10 samples")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise ValueError(f"--data {path!r}: y must hold non-negative integer class labels")
    x = torch.tensor(np.asarray(x, dtype=np.float32)).reshape(len(x), -1)
    y = torch.tensor(np.asarray(y, dtype=np.int64))
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(len(x) * (1 - test_fraction))
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


def make_model(inputs: int, classes: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(inputs, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, classes))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


@dataclass
class ModeResult:
    mode: str
    wall_s: float
    samples: int                      # over all ranks
    steps: List[int]                  # per rank
    wait_s: List[float]               # per rank, time blocked in communication
    time_to_target_s: Optional[float]
    averaged_accuracy: float
    worst_accuracy: float
    consensus_distance: float
    curve: List[Tuple[float, float]] = field(default_factory=list)  # rank 0: (seconds, accuracy)
    # collectives (P-Reduces, exchanges, all-reduces) by their number of members, each once
    groups_by_size: Dict[int, float] = field(default_factory=dict)
    # per rank, of the Group Generator's requests: (median, 90th percentile) of the time each
    # took beyond the generator's wait for a group, in ms, and their number; None: no requests
    request_cost_ms: List[Optional[Tuple[float, float, int]]] = field(default_factory=list)
    # the Group Generator's divisions by why they ran: (divisions, ready workers divided)
    division_reasons: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    # the Group Generator's latest requests and divisions (GeneratorSchedule.generator_events)
    generator_events: List[tuple] = field(default_factory=list)

    @property
    def mean_group_size(self) -> float:
        return metrics.mean_group_size(self.groups_by_size)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


def train_mode(data: Dataset, sync: str, seconds: float, batch: int = 32, lr: float = 0.05,
               target: float = 0.9, schedule: Optional[str] = None, group_size: int = 2,
               eval_every: int = 5, progress: bool = True, seed: int = 0) -> ModeResult:
    """Train a fresh model with ``sync`` for ``seconds`` of wall time on every rank, then
    join, measure, average. Collective: every rank calls it with the same arguments."""
    rank, size = hvd.rank(), hvd.size()
    model = make_model(data.x_train.shape[1], data.classes, seed)
    options = {"model": model} if sync in ("adpsgd", "adpsgd-sync") else {}
    if sync == "ripples":
        options = {"schedule": schedule, "group_size": group_size, "model": model}
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                         named_parameters=model.named_parameters(), sync=sync,
                                         **options)
    shard_x, shard_y = data.x_train[rank::size], data.y_train[rank::size]
    generator = torch.Generator().manual_seed(seed + rank)
    bar = progress_bar(seconds, f"{sync:>9}", unit="s") if progress and rank == 0 else None
    curve, time_to_target = [], None
    # Schedules computed without communication cannot let a rank leave early: with them all
    # ranks stop at one agreed step (the slowest clock, compared every 10 steps).
    stop_together = sync == "adpsgd-sync" or schedule in ("static", "random")
    hvd.barrier()
    start = time.perf_counter()
    step = 0
    while not _time_is_up(time.perf_counter() - start, seconds, step, stop_together):
        index = torch.randint(len(shard_x), (batch,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(shard_x[index]), shard_y[index]).backward()
        optimizer.step()
        step += 1
        elapsed = time.perf_counter() - start
        if rank == 0 and step % eval_every == 0:
            acc = accuracy(model, data.x_test, data.y_test)
            curve.append((elapsed, acc))
            if time_to_target is None and acc >= target:
                time_to_target = elapsed
        if bar is not None:
            bar.update(min(elapsed, seconds) - bar.n)
    hvd.join()
    wall = time.perf_counter() - start
    if bar is not None:
        bar.close()
    if hasattr(optimizer, "close"):
        optimizer.close()
    local_accuracy = accuracy(model, data.x_test, data.y_test)
    distance = hvd.consensus_distance(model)
    hvd.average_model(model)
    ranks_schedule = getattr(optimizer, "schedule", None)  # the Schedule object in use
    stats = hvd.allgather_object((step, optimizer.metrics.wait_s, local_accuracy,
                                  dict(optimizer.metrics.groups_by_size),
                                  _request_cost_ms(ranks_schedule)))
    memberships = collections.Counter()  # every member of a group counts it
    for *_, by_size, _ in stats:
        memberships.update(by_size)
    return ModeResult(
        mode=sync if schedule is None else f"{sync}/{schedule}", wall_s=wall,
        samples=sum(s[0] for s in stats) * batch, steps=[s[0] for s in stats],
        wait_s=[s[1] for s in stats], time_to_target_s=time_to_target,
        averaged_accuracy=accuracy(model, data.x_test, data.y_test),
        worst_accuracy=min(s[2] for s in stats), consensus_distance=distance, curve=curve,
        groups_by_size={k: n / k for k, n in sorted(memberships.items())},
        request_cost_ms=[s[4] for s in stats],
        division_reasons=getattr(ranks_schedule, "division_reasons", dict)(),
        generator_events=getattr(ranks_schedule, "generator_events", list)())


def _request_cost_ms(schedule) -> Optional[Tuple[float, float, int]]:
    costs = getattr(schedule, "request_costs", list)()
    if not costs:
        return None
    median, p90 = np.percentile(np.asarray(costs) * 1e3, [50, 90])
    return float(median), float(p90), len(costs)


def _time_is_up(elapsed: float, seconds: float, step: int, together: bool) -> bool:
    if not together:
        return elapsed >= seconds
    if step % 10:
        return False
    slowest = hvd.allreduce(torch.tensor([elapsed]), op=hvd.Max)
    return slowest.item() >= seconds


def format_table(results: List[ModeResult], target: float) -> str:
    header = (f"{'mode':<20} {'wall(s)':>8} {'samples/s':>10} {'steps/rank':>16} "
              f"{'t->' + format(target, '.0%') + '(s)':>10} {'avg acc':>8} {'worst acc':>9}")
    lines = [header, "-" * len(header)]
    for r in results:
        ttt = f"{r.time_to_target_s:.1f}" if r.time_to_target_s is not None else "not reached"
        steps = f"{min(r.steps)}..{max(r.steps)}"
        lines.append(f"{r.mode:<20} {r.wall_s:>8.1f} {r.samples_per_s:>10.0f} {steps:>16} "
                     f"{ttt:>10} {r.averaged_accuracy:>8.3f} {r.worst_accuracy:>9.3f}")
    return "\n".join(lines)


def save_plot(results: List[ModeResult], path: str, title: str) -> None:
    _demo_dependency("matplotlib", "matplotlib").use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        if r.curve:
            ax.plot(*zip(*r.curve), label=r.mode)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy of rank 0's model")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ripples.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=".npz file with arrays x and y (default: digits)")
    parser.add_argument("--seconds", type=float, default=20.0, help="wall time per mode")
    parser.add_argument("--modes", default="allreduce,ripples",
                        help="comma-separated: allreduce, ripples, adpsgd")
    parser.add_argument("--schedule", default="generator", choices=["static", "random", "generator"])
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=20.0,
                        help="emulated compute per step when the launcher sets none")
    parser.add_argument("--target", type=float, default=0.9, help="target test accuracy")
    parser.add_argument("--plot", default="ripples_demo.png", help="where to save the plot")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("allreduce", "ripples", "adpsgd")]
    if bad or not modes:
        parser.error(f"--modes: {bad or 'nothing'} not valid; use allreduce, ripples, adpsgd")
    if args.seconds <= 0:
        parser.error("--seconds must be > 0")
    return args, modes


def main(argv=None) -> int:
    args, modes = parse_args(argv)
    config = Config.load()
    hvd.init(**({} if config.compute_ms else {"compute_ms": args.compute_ms}))
    from ripples.runtime import current
    settings = current().config
    data = load_data(args.data)
    rank = hvd.rank()
    if rank == 0:
        print(f"ripples demo: {hvd.size()} ranks, data {args.data or 'digits (scikit-learn)'} "
              f"({len(data.x_train)} train / {len(data.x_test)} test), compute "
              f"{'emulated ' + format(settings.compute_ms, 'g') + ' ms/step' if settings.compute_ms else 'real'}, "
              f"slowdown {settings.slowdown or 'none'}, {args.seconds:g} s per mode", flush=True)
    results = []
    for mode in modes:
        schedule = args.schedule if mode == "ripples" else None
        results.append(train_mode(data, mode, args.seconds, target=args.target,
                                  schedule=schedule, group_size=args.group_size))
    if rank == 0:
        print(format_table(results, args.target))
        if len(results) > 1 and results[0].samples_per_s > 0:
            for r in results[1:]:
                print(f"{r.mode}: {r.samples_per_s / results[0].samples_per_s:.2f}x the samples/s "
                      f"of {results[0].mode}")
        save_plot(results, args.plot, f"{hvd.size()} ranks, slowdown {settings.slowdown or 'none'}")
        print(f"plot saved to {os.path.abspath(args.plot)}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
