"""The fixed-size step record and the bucket plan: pure logic, no processes."""
import numpy as np
import torch

from ripples.comm import step_record
from ripples.torch.gradient_buckets import plan_buckets


def summed(records):
    return np.sum(np.stack(records), axis=0)


def test_a_record_is_48_bytes_whatever_the_group_size():
    for members in (2, 64, 4096):
        records = [step_record.encode(True, step_record.plan_hash(["plan"]), 7)
                   for _ in range(members)]
        assert all(r.nbytes == 48 for r in records)
        agreement = step_record.decode(summed(records))
        assert agreement == (members, 0, True, True, 7)


def test_one_member_on_another_plan_or_step_is_caught():
    plan = step_record.plan_hash(["plan"])
    records = [step_record.encode(True, plan, 3) for _ in range(4095)]
    assert not step_record.decode(summed(records + [step_record.encode(True, plan + 1, 3)])).same_plan
    late = step_record.decode(summed(records + [step_record.encode(True, plan, 2)]))
    assert late.same_plan and not late.same_epoch and late.epoch == -1


def test_values_that_only_sum_alike_still_differ():
    # 1 + 3 == 2 + 2: the sums match, the sums of squares do not.
    records = [step_record.encode(True, h, 0) for h in (1, 3)]
    assert not step_record.decode(summed(records)).same_plan


def test_joined_members_count_apart_and_do_not_disturb_the_check():
    plan = step_record.plan_hash(["plan"])
    records = [step_record.encode(True, plan, 5) for _ in range(3)]
    records += [step_record.encode(False, 0, 0) for _ in range(2)]
    assert step_record.decode(summed(records)) == (3, 2, True, True, 5)
    assert step_record.decode(summed(records[3:])).active == 0


def test_buckets_take_parameters_last_first_by_size_and_dtype():
    sizes = [400, 100, 100, 300, 50]
    f32, f64 = torch.float32, torch.float64
    assert plan_buckets(sizes, [f32] * 5, 350) == [[4, 3], [2, 1], [0]]
    assert plan_buckets(sizes, [f32] * 5, 10_000) == [[4, 3, 2, 1, 0]]
    assert plan_buckets(sizes, [f32, f32, f64, f64, f32], 10_000) == [[4], [3, 2], [1, 0]]
    assert plan_buckets(sizes, [f32] * 5, 1) == [[4], [3], [2], [1], [0]]
    assert plan_buckets([], [], 100) == []
