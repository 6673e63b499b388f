"""Slow is not dead (run with RIPPLES_TIMEOUT_S=2 on 3 ranks): a rank alive but busy outside
ripples for several timeouts never fails its peers; ranks waiting on each other inside
ripples fail, naming them, within about twice the timeout."""
import time

import pytest
import torch

import ripples.torch as hvd
from ripples.comm.liveness import answer_wait_s
from ripples.core.errors import RipplesError
from ripples.runtime import current

from lock_hold import hold_the_interpreter_lock

BUSY_TIMEOUTS = 3  # how many timeouts the busy rank keeps the others waiting


def _timeout() -> float:
    hvd.init()
    timeout = current().config.timeout_s
    assert timeout <= 3 and current().config.wait_for_busy_peers, \
        "run this module with RIPPLES_TIMEOUT_S small and the liveness check on"
    return timeout


def test_a_blocking_allreduce_waits_for_a_busy_rank():
    busy_s = BUSY_TIMEOUTS * _timeout()
    start = time.monotonic()
    if hvd.rank() == 2:
        time.sleep(busy_s)  # an evaluation, a checkpoint: outside ripples
    out = hvd.allreduce(torch.full((3,), float(hvd.rank() + 1)), name="late", op=hvd.Sum)
    assert out.tolist() == [6.0, 6.0, 6.0]
    assert time.monotonic() - start >= busy_s - 0.5 or hvd.rank() == 2


def test_a_rank_holding_the_interpreter_lock_is_slow_not_dead():
    """Rank 1's responder cannot answer while its main thread holds the interpreter lock
    for longer than the timeout and the answer bound together; its process runs, so it is
    slow, not dead, and the others wait for it."""
    timeout = _timeout()
    if hvd.rank() == 1:  # long enough for a question of the others' to fall well inside
        hold_the_interpreter_lock(current().liveness.check_after_s()
                                   + 3 * answer_wait_s(timeout))
    out = hvd.allreduce(torch.ones(2), name="after-the-hold", op=hvd.Sum)
    assert out.tolist() == [3.0, 3.0]


def test_an_asynchronous_allreduce_stays_pending_while_a_rank_is_busy():
    busy_s = BUSY_TIMEOUTS * _timeout()
    if hvd.rank() == 0:
        time.sleep(busy_s)
    handle = hvd.allreduce_async(torch.ones(2), name="async-late", op=hvd.Sum)
    if hvd.rank() != 0:
        time.sleep(busy_s)  # the engine thread keeps negotiating meanwhile
    assert hvd.synchronize(handle).tolist() == [3.0, 3.0]


def test_join_waits_for_a_rank_that_trains_much_longer():
    """Uneven training: ranks 0 and 1 stop early and join; rank 2 steps 10x slower and
    finishes long after them (several timeouts), with no error anywhere."""
    timeout = _timeout()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step_s = 0.25 * timeout if hvd.rank() == 2 else 0.025 * timeout
    steps = 16 if hvd.rank() == 2 else 4
    start = time.monotonic()
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        time.sleep(step_s)
        opt.step()
    last = hvd.join()
    assert last == 2
    if hvd.rank() == 0:
        assert time.monotonic() - start > 3 * timeout  # the others waited that long
    weights = hvd.allgather(model.weight.detach().reshape(1, -1), name="weights")
    assert torch.equal(weights[0], weights[1])
    # Rank 2's 12 steps after the others joined averaged over the one member contributing:
    # the gradient of the summed output over 2 rows of ones is 2 per weight, at lr 0.1.
    torch.testing.assert_close(weights[2], weights[0] - 12 * 0.1 * 2.0)
    opt.close()


def test_an_adpsgd_passive_waits_for_an_active_rank_busy_before_it_ends():
    busy_s = BUSY_TIMEOUTS * _timeout()
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sync="adpsgd")
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
    if opt.active:
        time.sleep(busy_s)  # a long evaluation before the end: the passives wait for it
    hvd.join()
    opt.close()


def test_ranks_waiting_on_each_other_fail_naming_them():
    """Rank 1 waits on a process set {1, 2} while ranks 0 and 2 wait on the world: nobody is
    busy, so every rank fails (none hangs), not before the timeout. The first to find the
    deadlock names it; a rank that learns later may see the first already gone on to its
    next collective, which it reports as a mismatch."""
    timeout = _timeout()
    bound = 5 * timeout + 6  # two or three checks of the waits, on a loaded machine
    pair = hvd.add_process_set([1, 2])
    start = time.monotonic()
    with pytest.raises(RipplesError) as info:
        if hvd.rank() == 1:
            hvd.allreduce(torch.ones(2), name="pair", process_set=pair)
        else:
            hvd.allreduce(torch.ones(2), name="world")
    elapsed = time.monotonic() - start
    assert timeout < elapsed < bound, elapsed
    named = "waiting on each other" in str(info.value)
    if named:
        assert set(info.value.missing) == ({2} if hvd.rank() == 1 else {1})
    time.sleep(bound - elapsed)  # every rank has failed by now: meet again
    assert hvd.allreduce(torch.tensor([int(named)]), name="named", op=hvd.Max).item() == 1
    hvd.remove_process_set(pair)


def test_a_garbled_question_leaves_the_responder_answering():
    """A message that is not a question (garbage on the wire) is dropped: the responder
    goes on answering, else its rank would be taken for a dead one."""
    from ripples.comm import liveness

    _timeout()
    checks = current().liveness
    if hvd.rank() == 0:
        checks.comm.Send(b"\xb0 not a pickle", dest=1, tag=liveness._PING)
        checks.comm.send("a pickle, not a question", dest=1, tag=liveness._PING)
        time.sleep(0.2)
        answers = checks.probe([1, 2])
        assert answers[1] is not None and answers[2] is not None, answers
    hvd.allreduce(torch.ones(1), name="after-garbage")

