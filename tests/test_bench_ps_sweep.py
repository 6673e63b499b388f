"""The repeated PS sweep's summary (``benchmarks/ps/sweep_summary.py``): medians over runs,
misses ranked last, and each row against the best fixed policy of its setting."""
import sys

import pytest

from mpi_launch import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "benchmarks"))
from ps.sweep_summary import is_fixed_policy, median_time, summarize_runs  # noqa: E402


def run(row, time_to_target, steps_per_s=100.0, ratio=3.0, slow_workers=1):
    return {"ratio": ratio, "slow_workers": slow_workers, "hidden": 64, "row": row,
            "time_to_target_s": time_to_target, "steps_per_s": steps_per_s,
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
