"""The repeated PS sweep's summary (``benchmarks/ps/sweep_summary.py``): medians over runs,
misses ranked last, each row against the best fixed policy of its setting, and the held
time to target that a swing above the target does not meet."""
import sys

import pytest

from mpi_launch import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "benchmarks"))
from ps.sweep_summary import (held_time, is_fixed_policy, median_time,  # noqa: E402
                              summarize_runs)


def run(row, time_to_target, steps_per_s=100.0, ratio=3.0, slow_workers=1, held=None):
    return {"ratio": ratio, "slow_workers": slow_workers, "hidden": 64, "row": row,
            "time_to_target_s": time_to_target, "time_to_target_held_s": held,
            "steps_per_s": steps_per_s,
            "final_accuracy": 0.9, "push_bytes_per_sample": 1000.0, "stale_push_share": None}


@pytest.mark.parametrize("times, expected", [
    ([3.0, 1.0, 2.0], 2.0),
    ([4.0, 1.0, 2.0, 3.0], 2.5),
    ([None, 1.0, 2.0], 2.0),         # one miss of three: the median is still a time
    ([None, None, 1.0], None),       # most runs missed: not reached
    ([None, 1.0, 2.0, 3.0], 2.5),
    ([None, None, 1.0, 2.0], None),  # the middle pair holds a miss
])
def test_a_miss_ranks_after_every_time(times, expected):
    assert median_time(times) == expected


def test_the_fixed_policies_are_bsp_ssp_asp_and_epsp_whatever_their_staleness():
    assert [is_fixed_policy(r) for r in
            ["BSP", "SSP(s=2)", "ASP", "EPSP(s=0)", "CASP(auto)", "CASP(C=2)"]] == \
        [True, True, True, True, False, False]


def test_each_row_is_held_against_the_best_fixed_median_of_its_own_setting():
    runs = [run("BSP", 4.0), run("ASP", 2.0), run("CASP(auto)", 3.0),
            run("BSP", 6.0), run("ASP", 1.0), run("CASP(auto)", 2.0),
            run("BSP", 5.0), run("ASP", None), run("CASP(auto)", 2.5),
            # another setting, where ASP never reaches the target
            run("BSP", 8.0, ratio=10.0), run("ASP", None, ratio=10.0),
            run("CASP(C=4)", 4.0, ratio=10.0)]
    rows = {(r["ratio"], r["row"]): r for r in summarize_runs(runs)}
    assert rows[(3.0, "BSP")]["time_to_target_s"] == 5.0
    assert rows[(3.0, "ASP")]["time_to_target_s"] == 2.0
    assert rows[(3.0, "ASP")]["times_to_target_s"] == [1.0, 2.0, None]
    assert rows[(3.0, "CASP(auto)")]["best_fixed_s"] == 2.0
    assert rows[(3.0, "CASP(auto)")]["vs_best_fixed"] == pytest.approx(1.25)
    assert rows[(3.0, "BSP")]["runs"] == 3
    assert rows[(10.0, "ASP")]["time_to_target_s"] is None
    assert rows[(10.0, "ASP")]["vs_best_fixed"] is None
    # CASP(C=4) is not a fixed policy: BSP's 8 s is the best there
    assert rows[(10.0, "CASP(C=4)")]["vs_best_fixed"] == pytest.approx(0.5)


def test_a_swing_above_the_target_is_not_a_held_time():
    # 0.85 at 0.4 s is a swing; the means of three reach 0.8 only at 1.2 s:
    # 0.633, 0.74, 0.737, then (0.82 + 0.84 + 0.86) / 3 = 0.84
    curve = [(0.2, 0.5), (0.4, 0.85), (0.6, 0.55), (0.8, 0.82), (1.0, 0.84), (1.2, 0.86)]
    assert held_time(curve, 0.8) == 1.2
    assert held_time(curve, 0.8, evaluations=1) == 0.4  # the first crossing
    assert held_time(curve, 0.9) is None
    assert held_time(curve[:2], 0.1) is None  # fewer evaluations than the window


def test_held_times_are_held_against_the_best_fixed_held_median():
    runs = [run("ASP", 1.0, held=3.0), run("CASP(auto)", 2.0, held=2.4),
            run("ASP", 1.2, held=2.0), run("CASP(auto)", 2.2, held=2.6),
            run("ASP", 1.4, held=4.0), run("CASP(auto)", 2.4, held=None)]
    rows = {r["row"]: r for r in summarize_runs(runs)}
    assert rows["ASP"]["time_to_target_held_s"] == 3.0
    assert rows["CASP(auto)"]["times_to_target_held_s"] == [2.4, 2.6, None]
    assert rows["CASP(auto)"]["vs_best_fixed"] == pytest.approx(2.2 / 1.2)
    assert rows["CASP(auto)"]["vs_best_fixed_held"] == pytest.approx(2.6 / 3.0)
