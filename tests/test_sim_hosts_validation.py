"""The simulator against the runs across 4 emulated hosts at 100 Mbit/s (2 MB model, 8
ranks; ``benchmarks/results/train_hosts4x2_100mbit_2mb_{,generator_}{1,2,3}.json``: every
mode three times, the two generators three more), in the ``fair``
calibration of ``benchmarks/sim_hosts.py``: the links as ``benchmarks/link.py`` measured
them apart from the runs, shared fairly, with a 2% spread of step times. Each run is
simulated with seeds 0-4 and the median over runs and seeds is compared with the median
measured throughput (``docs/simulator.md``, "Fair link sharing").

The node-aware generator is not compared here: it changed after these runs (a worker ready
alone on its node now steps alone instead of joining a group across nodes), so the
simulator, which runs the real generator, no longer simulates what these runs measured.
``test_sim_hosts_1gbit_validation.py`` compares it with runs of the current generator.

Rows known to miss 15% are expected failures (strict: the test fails if one starts to
fit, so the statement stays true): the topology-blind generator in every scenario (the
simulated one forms other groups; its rate spreads by 20-50 points over seeds), and
asynchronous AD-PSGD in these runs, which predate its responder fix (the later runs are
compared in ``sim_hosts4x2_100mbit_adpsgd.json``).
"""
import json
import sys

import pytest

from mpi_launch import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "benchmarks"))
import sim_hosts  # noqa: E402

from ripples.sim.validation import target_steps  # noqa: E402

pytestmark = pytest.mark.xdist_group("sim_hosts_validation")  # one module-scoped fixture

RESULTS = REPO_DIR / "benchmarks" / "results"
SEEDS = range(5)
SCENARIOS = ("homogeneous", "one-slow", "random-slow")
MODES = ("allreduce", "static", "random", "generator", "adpsgd", "adpsgd-sync")
KNOWN_GAPS = {(s, m) for s in SCENARIOS for m in ("generator", "adpsgd")}


def _load(name):
    return json.loads((RESULTS / name).read_text())


@pytest.fixture(scope="module")
def rows():
    link = sim_hosts.median_link([_load(f"link_hosts4x2_100mbit_{i}.json") for i in (1, 2, 3)])
    fair = {"fair": sim_hosts.calibrations(link)["fair"]}
    runs = [_load(f"train_hosts4x2_100mbit_2mb_{kind}{i}.json")
            for kind in ("", "generator_") for i in (1, 2, 3)]
    found = sim_hosts.compare_runs(runs, target_steps(_load("train_np8.json")), fair, SEEDS)
    return {(r["scenario"], r["mode"]): r for r in found}


def test_every_measured_row_is_compared(rows):
    assert sorted(rows) == sorted((s, m) for s in SCENARIOS for m in MODES + ("generator-node",))


@pytest.mark.parametrize("scenario,mode", [
    pytest.param(s, m, marks=pytest.mark.xfail(strict=True, reason="known gap, see module doc"))
    if (s, m) in KNOWN_GAPS else (s, m) for s in SCENARIOS for m in MODES])
def test_throughput_within_15_percent(rows, scenario, mode):
    row = rows[(scenario, mode)]
    assert abs(row["error_fair"]) <= 0.15, row
