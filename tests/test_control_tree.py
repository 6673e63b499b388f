"""The fixed-size control round's pure parts: the tree over a group, the record's size,
the decision rule. The round itself runs under mpiexec in test_control_tree_mpi.py."""
import pytest

from ripples.comm import control_tree as tree


def _up(*fields):
    """An up-the-tree record as ``agree`` builds it: kind, attempt, group hash, digest,
    flags, earliest and latest post time."""
    return tuple(fields)


@pytest.mark.parametrize("size", [1, 2, 16, 17, 18, 257, 4096, 5000])
def test_every_member_but_the_root_has_exactly_one_parent(size):
    seen = []
    for index in range(size):
        for child in tree.tree_children(index, size):
            assert tree.tree_parent(child) == index
            seen.append(child)
    assert sorted(seen) == list(range(1, size))
    assert tree.tree_parent(0) is None


@pytest.mark.parametrize("size,height", [(1, 0), (2, 1), (17, 1), (18, 2), (273, 2),
                                         (274, 3), (4096, 3), (4369, 3), (4370, 4)])
def test_the_tree_is_logarithmic(size, height):
    # a full tree of fan-out 16 holds 1 + 16 + 256 + 4096 = 4369 members in 4 levels
    assert tree.tree_height(0, size) == height


def test_a_record_for_4096_ranks_is_as_small_as_for_two():
    small = _up(tree._UP, 1, tree.group_hash(range(2)), tree.digest([("a", "s", "")]),
                          0, 0, 0)
    big_group = tuple(range(4096))
    entries = [(f"grad.{i}", "allreduce op=Average dtype=float32 shapes=[(1024,)]", "")
               for i in range(300)]
    big = _up(tree._UP, 2, tree.group_hash(big_group), tree.digest(entries), 0, 0, 0)
    assert len(tree._encode(small)) == len(tree._encode(big)) == 128
    failure = tree._failure(tree._FAILED, 3, tree.group_hash(big_group), list(range(4000)), 4000)
    assert len(tree._encode(failure)) == 128
    assert tree._missing_of(failure) == (list(range(tree.MAX_NAMED)), 4000)


def test_digest_tells_order_and_signature_apart():
    a = ("a", "allreduce dtype=float32", "")
    b = ("b", "allreduce dtype=float32", "")
    b16 = ("b", "allreduce dtype=float16", "")
    assert tree.digest([a, b]) == tree.digest([a, b])
    assert len({tree.digest([a, b]), tree.digest([b, a]), tree.digest([a, b16]),
                tree.digest([a])}) == 4
    assert 0 <= tree.digest([a, b]) < 2 ** 63


def _combined(flags=0, t_min=1000, t_max=1000):
    return (tree._UP, 1, 7, 99, flags, t_min, t_max)


def test_unanimous_only_without_flags_and_within_half_the_timeout():
    decide = tree._decide
    assert decide(_combined(), 2.0, 0)[tree._KIND] == tree._UNANIMOUS
    assert decide(_combined(t_max=1999), 2.0, 0)[tree._KIND] == tree._UNANIMOUS
    # a record as old as half the timeout may come from a member that gave up since
    assert decide(_combined(t_max=2000), 2.0, 0)[tree._KIND] == tree._FULL_ROUND
    for flag in (tree.WANTS_FULL_ROUND, tree._DIFFERENT, tree._FOREIGN):
        assert decide(_combined(flags=flag), 2.0, 0)[tree._KIND] == tree._FULL_ROUND
    decision = decide(_combined(), 2.0, 5)
    assert decision[tree._ROOT] == 5 and decision[tree._GROUP] == 7


def test_failures_merge_their_missing_ranks():
    one = tree._failure(tree._FAILED, 1, 7, [9, 4], 2)
    two = tree._failure(tree._FAILED, 2, 7, list(range(20, 28)), 30)
    missing, count = tree._merge_missing([one, two])
    assert count == 32
    assert missing == sorted([9, 4] + list(range(20, 28)))[:tree.MAX_NAMED]


def test_inner_nodes_wait_longer_than_their_children():
    assert tree._gather_s(2.0, 1) == 2.0  # parents of leaves wait the timeout itself
    assert tree._gather_s(2.0, 2) > tree._gather_s(2.0, 1)
    assert tree._gather_s(2.0, 3) > tree._gather_s(2.0, 2)
    assert tree._gather_s(4.0, 3) == 6.0
