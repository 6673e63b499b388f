"""Communication-free schedules: static (Prague), random partition, AD-PSGD pairs."""
import itertools

import pytest

from ripples.schedule import (adpsgd_pairs, make_schedule, random_partition,
                              static_partition)


def assert_partition(groups, size):
    assert all(tuple(sorted(g)) == g for g in groups)
    assert sorted(r for g in groups for r in g) == list(range(size))


@pytest.mark.parametrize("size,local_size", [(n, l) for n in (1, 2, 3, 4, 7, 8, 12, 16)
                                             for l in (1, 2, 3, 4, 8) if l <= n])
def test_static_is_a_partition_every_step(size, local_size):
    for step in range(4 * local_size):
        assert_partition(static_partition(step, size, local_size), size)


def test_static_matches_published_pattern_for_four_per_node():
    # 3 nodes of 4: node n holds ranks 4n..4n+3
    assert static_partition(0, 12, 4) == sorted(
        [(0, 4, 8), (1,), (5,), (9,), (2, 3), (6, 7), (10, 11)])
    assert static_partition(1, 12, 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert static_partition(2, 12, 4) == sorted(
        [(1, 5, 9), (2,), (6,), (10,), (0, 3), (4, 7), (8, 11)])
    assert static_partition(3, 12, 4) == static_partition(1, 12, 4)


def test_static_rotates_the_cross_node_representative():
    reps = [min(g for g in static_partition(2 * j, 8, 4) if len(g) == 2 and g[1] - g[0] == 4)
            for j in range(4)]
    assert reps == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_static_single_node_and_one_per_node():
    assert static_partition(0, 4, 4) == [(0,), (1,), (2, 3)]
    assert static_partition(1, 4, 4) == [(0, 1, 2, 3)]
    assert static_partition(0, 5, 1) == static_partition(1, 5, 1) == [(0, 1, 2, 3, 4)]


def test_random_partition_is_shared_and_a_partition():
    for step in range(50):
        p = random_partition(7, step, 10, 4)
        assert p == random_partition(7, step, 10, 4)
        assert_partition(p, 10)
        assert sorted(len(g) for g in p) == [2, 4, 4]
    assert len({tuple(random_partition(7, s, 10, 4)) for s in range(50)}) > 40
    assert random_partition(7, 0, 10, 4) != random_partition(8, 0, 10, 4)


def test_adpsgd_pairs_are_bipartite_with_increasing_seq():
    for step in range(30):
        pairs = adpsgd_pairs(3, step, 7)
        assert [seq for seq, _ in pairs] == list(range(4 * step, 4 * step + 4))
        for (seq, (a, b)), active in zip(pairs, (0, 2, 4, 6)):
            assert a < b and {a % 2, b % 2} == {0, 1} and active in (a, b)
    assert adpsgd_pairs(0, 0, 1) == []


def test_schedule_objects_agree_with_each_other():
    n = 6
    for kind in ("static", "random", "adpsgd"):
        scheds = [make_schedule(kind, rank=r, size=n, local_size=3, group_size=2, seed=1)
                  for r in range(n)]
        for step in range(20):
            views = [s.groups_for_step(step) for s in scheds]
            for r, view in enumerate(views):
                seqs = [seq for seq, _ in view]
                assert seqs == sorted(set(seqs))
                for seq, group in view:
                    assert r in group
                    assert all((seq, group) in views[m] for m in group)
        for s in scheds:
            assert s.leave() == []
            with pytest.raises(ValueError, match="has left"):
                s.groups_for_step(20)


@pytest.mark.parametrize("kwargs,message", [
    (dict(kind="ring"), "kind must be one of 'static', 'random', 'generator', 'generator-node', 'adpsgd'"),
    (dict(policy="fast"), "policy must be one of 'ready', 'all'"),
    (dict(group_size=0), r"group_size must be >= 1 and <= size \(8\), got 0"),
    (dict(group_size=9), r"group_size must be >= 1 and <= size \(8\), got 9"),
    (dict(rank=8), r"rank must be >= 0 and <= size - 1 \(7\), got 8"),
    (dict(local_size=0), "local_size must be >= 1"),
    (dict(kind="generator"), "comm must be an mpi4py communicator"),
])
def test_make_schedule_rejects_bad_arguments(kwargs, message):
    args = dict(kind="random", rank=0, size=8, group_size=2) | kwargs
    with pytest.raises(ValueError, match=message):
        make_schedule(args.pop("kind"), **args)


def test_make_schedule_rejects_wrong_types():
    with pytest.raises(TypeError, match="group_size must be an int"):
        make_schedule("random", rank=0, size=8, group_size=2.0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        make_schedule("static", rank=0, size=8).groups_for_step(-1)
