"""``ripples.comm.control.judge``: the leader's decision from every member's record."""
from ripples.comm.control import Record, judge

GROUP = (0, 1)


def entry(name, signature="allreduce float32 (1,) sum"):
    return (name, signature, "allreduce|float32|sum|4")


def test_members_blocked_on_different_names_fail_with_the_join_fix_named():
    replies = judge({0: Record(GROUP, False, -1, True, [entry("train_loss")]),
                     1: Record(GROUP, False, -1, True, [entry("allreduce.noname.0")])},
                    "allreduce")
    for rank, name in ((0, "train_loss"), (1, "allreduce.noname.0")):
        status, _create, _active, run, failed, _missing = replies[rank]
        assert status == "ok" and run == [] and list(failed) == [name]
        kind, message = failed[name]
        assert kind == "mismatch"
        assert "rank 0: ['train_loss']; rank 1: ['allreduce.noname.0']" in message
        assert "hvd.join() after the loop" in message


def test_a_member_not_yet_blocked_is_waited_for():
    replies = judge({0: Record(GROUP, False, -1, True, [entry("train_loss")]),
                     1: Record(GROUP, False, -1, False, [entry("val_loss")])}, "allreduce")
    assert all(reply[4] == {} for reply in replies.values())  # nothing failed yet
    assert replies[0][5] == {"train_loss": [1]} and replies[1][5] == {"val_loss": [0]}


def test_a_joined_member_takes_part_in_what_the_active_members_run():
    replies = judge({0: Record(GROUP, False, -1, True, [entry("train_loss")]),
                     1: Record(GROUP, False, 3, False, [])}, "allreduce")
    assert replies[0][:4] == ("ok", False, 1, ["train_loss"])  # one active member
    assert replies[1][0] == "participate" and replies[1][3] == [("train_loss",
                                                                 entry("train_loss")[2])]
