"""The membership rule after a failure (``ripples.comm.membership``): who goes on, and why
two sides of one network cut never both do."""
import itertools

from ripples.comm.membership import decide, has_quorum


def test_a_majority_goes_on_and_a_minority_does_not():
    assert has_quorum([0, 1, 2, 3, 4, 5], [6, 7])  # one host of 4 cut off
    assert not has_quorum([6, 7], [0, 1, 2, 3, 4, 5])
    assert has_quorum([0, 1, 3], [2])  # one frozen rank of 4
    assert not has_quorum([2], [0, 1, 3])


def test_an_even_split_goes_on_on_the_side_of_the_lowest_rank():
    assert has_quorum([0, 1], [2, 3])
    assert not has_quorum([2, 3], [0, 1])
    assert has_quorum([1, 4], [2, 3])  # rank 0 died: the lowest left decides
    assert not has_quorum([], [])


def test_two_sides_of_any_cut_never_both_go_on():
    for size in range(1, 9):
        ranks = range(size)
        for k in range(size + 1):
            for side in itertools.combinations(ranks, k):
                other = [r for r in ranks if r not in side]
                assert not (has_quorum(list(side), other) and has_quorum(other, list(side)))
                if side and other:  # and one of them always does
                    assert has_quorum(list(side), other) or has_quorum(other, list(side))


def test_dead_ranks_do_not_count_against_the_survivors():
    # 5 of 8 died (MPI reported them): the 3 left reach each other and nobody is silent
    decision = decide(me=0, generation=2, answered=[1, 2], dead=[3, 4, 5, 6, 7], size=8)
    assert decision == (2, [0, 1, 2], [], [3, 4, 5, 6, 7])
    assert has_quorum(decision.members, decision.silent)


def test_the_silent_are_those_neither_reached_nor_dead():
    decision = decide(me=1, generation=0, answered=[0, 3], dead=[4], size=6)
    assert decision.members == [0, 1, 3]
    assert decision.silent == [2, 5]
    assert decision.dead == [4]
    # a rank MPI reports dead is not a member even if an answer of its was counted
    assert decide(me=0, generation=0, answered=[1, 2], dead=[2], size=3).members == [0, 1]
