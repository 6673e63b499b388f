"""The partner an asynchronous AD-PSGD active rank picks: pure, no processes."""
import collections

import pytest

from ripples.schedule.adpsgd import adpsgd_partner, adpsgd_roles, is_active


def test_roles_split_even_and_odd_ranks_at_any_size():
    assert adpsgd_roles(1) == ([0], [])
    assert adpsgd_roles(4) == ([0, 2], [1, 3])
    assert adpsgd_roles(5) == ([0, 2, 4], [1, 3])
    assert [is_active(r) for r in range(4)] == [True, False, True, False]


def test_survivors_keep_their_roles_where_both_roles_remain():
    # 4 ranks, rank 1 (passive) died: old ranks 0, 2, 3 are the new 0, 1, 2
    assert adpsgd_roles(3, [True, True, False]) == ([0, 1], [2])
    # rank 2 (active) died: old 0, 1, 3 -> new 0, 1, 2
    assert adpsgd_roles(3, [True, False, False]) == ([0], [1, 2])
    # only actives (or only passives) survive: the parity rule again
    assert adpsgd_roles(2, [True, True]) == ([0], [1])
    assert adpsgd_roles(3, [False, False, False]) == ([0, 2], [1])
    assert adpsgd_roles(1, [False]) == ([0], [])
    with pytest.raises(ValueError, match="was_active has 2 entries for a world of 3"):
        adpsgd_roles(3, [True, False])


def test_an_active_rank_picks_among_the_passives_it_is_given():
    assert {adpsgd_partner(7, 1, k, 3, passives=[2]) for k in range(20)} == {2}
    assert {adpsgd_partner(7, 0, k, 3, passives=[1, 2]) for k in range(200)} == {1, 2}
    assert adpsgd_partner(7, 2, 0, 3, passives=[2]) is None  # a passive rank
    assert adpsgd_partner(7, 0, 0, 1, passives=[]) is None  # nobody to average with


def test_active_ranks_pick_passive_ranks_evenly_and_reproducibly():
    picks = collections.Counter(adpsgd_partner(7, 2, k, 8) for k in range(4000))
    assert set(picks) == {1, 3, 5, 7}
    assert all(900 < count < 1100 for count in picks.values())  # 1000 expected each
    assert [adpsgd_partner(7, 2, k, 8) for k in range(50)] == \
        [adpsgd_partner(7, 2, k, 8) for k in range(50)]
    # ranks and seeds draw independently
    assert [adpsgd_partner(7, 0, k, 8) for k in range(50)] != \
        [adpsgd_partner(7, 2, k, 8) for k in range(50)]
    assert [adpsgd_partner(8, 2, k, 8) for k in range(50)] != \
        [adpsgd_partner(7, 2, k, 8) for k in range(50)]


def test_no_partner_for_passive_ranks_or_a_world_of_one():
    assert adpsgd_partner(0, 1, 0, 4) is None
    assert adpsgd_partner(0, 0, 0, 1) is None
    assert adpsgd_partner(0, 0, 3, 3) == 1  # one passive rank: always it


@pytest.mark.parametrize("kwargs,match", [
    (dict(seed=-1, rank=0, exchange=0, size=2), "seed"),
    (dict(seed=0, rank=2, exchange=0, size=2), "rank"),
    (dict(seed=0, rank=0, exchange=-1, size=2), "exchange"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        adpsgd_partner(**kwargs)
