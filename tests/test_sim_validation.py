"""The simulator against five measured 8-rank runs of benchmarks/train.py: throughput within
15% and time to target within 25%, per scenario and mode.

The simulator's ``this-machine`` preset takes its software costs from a separate
measurement (``benchmarks/latency_after_idle.py``: a P-Reduce and a generator request after
50 ms of sleep, as in training), not from these runs (the three latest runs, of faster
generator requests, get the costs measured for their code); the runs give one number, the
target (see ``ripples.sim.validation``).

One throughput is known to miss and is an expected failure (strict: the test fails if it
starts to fit, so the statement stays true): lock-step AD-PSGD (``adpsgd-sync``) under
random slowdowns, which the simulator overestimates by 23%. Its pairs change every step and
every rank stops at a global check every 10 steps; on the measured 2-core machine a slow
step's sleep and 8 ranks' wake-ups share two cores, which the model (no CPU contention)
does not contain.
"""
import json
from pathlib import Path

import pytest

from ripples.sim.validation import compare

# Its module-scoped fixture runs once per test process: keep its tests in one.
pytestmark = pytest.mark.xdist_group("sim_validation")

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
# The three runs after the generator client's faster waits, with the software costs measured
# for that code (latency_after_idle_np8_client.json, less what the links account for).
AFTER_CLIENT_CHANGE = ["--collective-overhead-us", "2520", "--service-latency-us", "754"]
MEASURED = {"train_np8": (RESULTS / "train_np8.json", []),  # every mode
            # allreduce, generator, adpsgd only:
            "doorbell": (RESULTS / "train_np8_doorbell.json", []),
            **{f"client_{i}": (RESULTS / f"train_np8_client_{i}.json", AFTER_CLIENT_CHANGE)
               for i in (1, 2, 3)}}
KNOWN_THROUGHPUT_GAPS = {("train_np8", "random-slow", "adpsgd-sync")}
MODES = ("allreduce", "static", "random", "generator", "adpsgd", "adpsgd-sync")
SCENARIOS = ("homogeneous", "one-slow", "random-slow")


@pytest.fixture(scope="module")
def rows():
    return {(run, r["scenario"], r["mode"]): r for run, (path, flags) in MEASURED.items()
            for r in compare(json.loads(path.read_text()), flags)}


CASES = [(run, s, m) for run in MEASURED for s in SCENARIOS for m in MODES
         if run == "train_np8" or m in ("allreduce", "generator", "adpsgd")]


def test_every_measured_row_is_compared(rows):
    assert sorted(rows) == sorted(CASES)


@pytest.mark.parametrize("run,scenario,mode", [
    pytest.param(*case, marks=pytest.mark.xfail(strict=True, reason="known gap, see module doc"))
    if case in KNOWN_THROUGHPUT_GAPS else case for case in CASES])
def test_throughput_within_15_percent(rows, run, scenario, mode):
    row = rows[(run, scenario, mode)]
    assert abs(row["throughput_ratio"] - 1) <= 0.15, row


@pytest.mark.parametrize("run,scenario,mode", CASES)
def test_time_to_target_within_25_percent(rows, run, scenario, mode):
    row = rows[(run, scenario, mode)]
    measured, simulated = row["measured_time_to_target_s"], row["sim_time_to_target_s"]
    if measured is None:
        # not reached within the measured wall time: the simulation, given the same time,
        # must not reach it much earlier than that either
        assert simulated is None or simulated >= row["wall_s"] / 1.25, row
    else:
        assert simulated is not None and abs(simulated / measured - 1) <= 0.25, row
