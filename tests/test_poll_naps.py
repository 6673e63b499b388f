"""How long a waiting rank naps between polls (ripples.comm.mpi.nap_cap)."""
import pytest

from ripples.comm.mpi import nap_cap


@pytest.mark.parametrize("waited_s, cap_s", [
    (0.006, 200e-6),  # a short wait: the peers' round trips are microseconds, stay close
    (0.05, 500e-6),   # 1% of the wait so far
    (0.1, 1e-3),
    (30.0, 1e-3),     # a slow peer: a thousand polls a second, no fewer
])
def test_naps_grow_with_the_wait_and_stay_a_small_share_of_it(waited_s, cap_s):
    assert nap_cap(waited_s) == pytest.approx(cap_s)
