"""The simulator against the runs across 4 emulated hosts at 1 Gbit/s with a 20 MB model
(8 ranks, every mode of the current code three times:
``benchmarks/results/train_hosts4x2_1gbit_20mb_nodealone_{1,2,3}.json``), in the ``fair``
calibration of ``benchmarks/sim_hosts.py``: the links as ``benchmarks/link.py`` measured
them apart from the runs (``link_hosts4x2_1gbit_ringhost_{1,2,3}.json``: ripples' ring among
all ranks, between two hosts and within each host), shared fairly, and the step as
``benchmarks/step_spread.py`` measured it without communication
(``step_spread_hosts4x2_20mb_{1,2,3}.json``: the padded compute, its spread, the update).
Each run is simulated with seeds 0-4 and the median over runs and seeds is compared with
the median measured throughput (``docs/simulator.md``, "Across hosts"). The ``ring``
calibration (links as measured, each collective at the share it found when it started) is
compared too.

Rows known to miss 15% are expected failures (strict: the test fails if one starts to fit,
so the statement stays true). Both calibrations miss the topology-blind generator with
homogeneous ranks: the simulated groups lock into fours in some seeds (3.1 members per
collective against 1.9 measured). ``fair`` also runs the node-aware generator too fast
without slow ranks (+28%, +21%) while it forms groups of the measured size (1.32 against
1.30).
"""
import json
import sys

import pytest

from mpi_launch import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "benchmarks"))
import sim_hosts  # noqa: E402

from ripples.sim.validation import target_steps  # noqa: E402

pytestmark = pytest.mark.xdist_group("sim_hosts_1gbit_validation")  # one module fixture

RESULTS = REPO_DIR / "benchmarks" / "results"
SEEDS = range(5)
SCENARIOS = ("homogeneous", "one-slow", "random-slow")
MODES = ("allreduce", "static", "generator", "generator-node", "adpsgd")
KNOWN_GAPS = {("ring", "homogeneous", "generator"), ("fair", "homogeneous", "generator"),
              ("fair", "homogeneous", "generator-node"), ("fair", "random-slow", "generator-node")}


def _load(name):
    return json.loads((RESULTS / name).read_text())


@pytest.fixture(scope="module")
def rows():
    link = sim_hosts.median_link([_load(f"link_hosts4x2_1gbit_ringhost_{i}.json")
                                  for i in (1, 2, 3)])
    step = sim_hosts.compute_flags([_load(f"step_spread_hosts4x2_20mb_{i}.json")
                                    for i in (1, 2, 3)])
    flags = {name: sim_hosts.calibrations(link)[name] + step for name in ("ring", "fair")}
    runs = [_load(f"train_hosts4x2_1gbit_20mb_nodealone_{i}.json") for i in (1, 2, 3)]
    found = sim_hosts.compare_runs(runs, target_steps(_load("train_np8.json")), flags, SEEDS)
    return {(r["scenario"], r["mode"]): r for r in found}


def test_every_measured_row_is_compared(rows):
    assert sorted(rows) == sorted((s, m) for s in SCENARIOS for m in MODES)


@pytest.mark.parametrize("calibration,scenario,mode", [
    pytest.param(c, s, m, marks=pytest.mark.xfail(strict=True, reason="known gap, see doc"))
    if (c, s, m) in KNOWN_GAPS else (c, s, m)
    for c in ("ring", "fair") for s in SCENARIOS for m in MODES])
def test_throughput_within_15_percent(rows, calibration, scenario, mode):
    row = rows[(scenario, mode)]
    assert abs(row[f"error_{calibration}"]) <= 0.15, row
