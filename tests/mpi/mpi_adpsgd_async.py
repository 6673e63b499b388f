"""Asynchronous AD-PSGD (``sync="adpsgd"``) on real ranks, at any world size.

Even ranks are active, odd ranks passive; a world of one trains alone. Expected values come
from the algorithm: averaging conserves the sum over ranks exactly (integer-valued data),
repeated averaging reaches the mean of the starting values, and quadratic objectives
``0.5 * ||x - c_i||^2`` have their joint optimum at the mean of the ``c_i``.
"""
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

import ripples.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
ACTIVE = R % 2 == 0
ACTIVES, PASSIVES = list(range(0, N, 2)), list(range(1, N, 2))
WORLD = MPI.COMM_WORLD


class Point(torch.nn.Module):
    """A float64 and a float32 parameter: two flat buffers, so two dtypes per exchange."""

    def __init__(self, wide, narrow):
        super().__init__()
        self.wide = torch.nn.Parameter(torch.as_tensor(wide, dtype=torch.float64))
        self.narrow = torch.nn.Parameter(torch.as_tensor(narrow, dtype=torch.float32))


def wrap(model, lr=0.0, **kwargs):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                    named_parameters=model.named_parameters(), sync="adpsgd",
                                    **kwargs)


def values(model):
    return [p.detach().clone() for p in model.parameters()]


def step_without_gradient(opt, model):
    """A step that leaves the parameters as they are (lr 0): only averaging changes them."""
    opt.zero_grad()
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()


def test_averaging_conserves_the_sum_exactly_and_pairs_end_equal():
    gen = torch.Generator().manual_seed(R)
    model = Point(torch.randint(-8, 9, (5,), generator=gen).double(),
                  torch.randint(-8, 9, (3,), generator=gen).float())
    before = WORLD.allgather([v.numpy() for v in values(model)])
    opt = wrap(model)
    assert len(opt.flat.buffers) == 2
    for _ in range(8):  # every exchange at most halves the unit: 8 * 2 + 4 bits stay exact
        step_without_gradient(opt, model)
    hvd.join()
    after = WORLD.allgather([v.numpy() for v in values(model)])
    counts = WORLD.allgather((ACTIVE, opt.exchanges))
    opt.close()
    for index in range(2):
        assert np.array_equal(sum(a[index] for a in after), sum(b[index] for b in before))
    started = sum(c for active, c in counts if active)
    served = sum(c for active, c in counts if not active)
    assert started == served == (8 * len(ACTIVES) if PASSIVES else 0)
    if N == 2:  # one pair: the first exchange leaves both at the mean, later ones keep it
        for index in range(2):
            mean = (before[0][index] + before[1][index]) / 2
            assert np.array_equal(after[0][index], mean) and np.array_equal(after[1][index], mean)
    if N == 1:
        assert all(np.array_equal(a, b) for a, b in zip(after[0], before[0]))


def test_replicas_that_start_apart_reach_the_mean_of_their_starting_points():
    start = torch.full((4,), 100.0 * R)
    model = Point(start.double(), start.float())
    opt = wrap(model)
    for _ in range(30):
        step_without_gradient(opt, model)
    hvd.join()
    opt.close()
    mean = 100.0 * (N - 1) / 2
    for value in values(model):
        assert torch.allclose(value.double(), torch.full((4,), mean, dtype=torch.float64),
                              atol=1e-3 * 100 * N), (R, value)


def test_quadratics_train_to_the_mean_of_the_targets():
    """Rank i minimizes 0.5 * ||x - c_i||^2 (the optimum of the average objective is the
    mean of the c_i), then only averages for a while. Alone, a replica would end at its
    own c_i; averaging brings every one near the mean.

    The ranks take their gradient steps at one rate (a barrier after each): the consensus
    of asynchronous averaging weighs each objective by the steps taken on it, so a rank
    racing ahead would pull it towards its own target."""
    direction = torch.tensor([2.0, -1.0, 4.0], dtype=torch.float64)
    target = R * direction
    optimum = (N - 1) / 2 * direction
    model = Point(torch.zeros(3, dtype=torch.float64) + 7.0 * (-1) ** R, torch.zeros(1))
    opt = wrap(model, lr=0.1)
    for step in range(100 + 40):
        if step == 100:  # then only averaging
            for group in opt.param_groups:
                group["lr"] = 0.0
        opt.zero_grad()
        (0.5 * (model.wide - target).square().sum()).backward()
        opt.step()
        if step < 100:
            WORLD.Barrier()
    hvd.join()
    opt.close()
    spread = max(((i * direction) - optimum).norm().item() for i in range(N))
    assert (model.wide.detach() - optimum).norm().item() <= 0.1 * spread + 1e-3, (
        R, model.wide, optimum)


def test_a_passive_rank_busy_computing_does_not_hold_up_the_active_ranks():
    """Every passive rank steps once, then stays in its 'computation' until every active
    rank has finished all its steps (they tell it on the world communicator): the active
    ranks' exchanges are served meanwhile, with the passive at one step. A lock-step
    pairing would never finish (and time out)."""
    if not PASSIVES:
        pytest.skip("a world of one has no passive rank")
    model = Point(torch.zeros(2, dtype=torch.float64), torch.zeros(1))
    opt = wrap(model)
    steps = 12
    if ACTIVE:
        for _ in range(steps):
            step_without_gradient(opt, model)
        assert opt.exchanges == steps and opt.metrics.steps == steps
        for passive in PASSIVES:
            WORLD.send(steps, dest=passive, tag=77)
    else:
        step_without_gradient(opt, model)
        for active in ACTIVES:
            while not WORLD.Iprobe(source=active, tag=77):
                time.sleep(0.005)
            WORLD.recv(source=active, tag=77)
        # Every active rank has finished: this rank served its share of their exchanges
        # while it had made one step.
        served_while_busy = opt.exchanges
        assert opt.metrics.steps == 1
    hvd.join()
    counts = WORLD.allgather(opt.exchanges if ACTIVE else served_while_busy)
    opt.close()
    assert sum(counts[p] for p in PASSIVES) == steps * len(ACTIVES)


def test_an_idle_responder_sleeps_on_its_doorbell_and_wakes_for_an_exchange():
    """Between exchanges a passive's responder sleeps on its doorbell, woken at most every
    ``MAX_WAIT_S`` (a napping responder wakes about a thousand times a second), and the
    active's ring brings it to the next exchange, which averages as ever."""
    from ripples.comm.doorbell import MAX_WAIT_S
    if not PASSIVES:
        pytest.skip("a world of one has no passive rank")
    model = Point(torch.full((2,), float(R), dtype=torch.float64), torch.zeros(1))
    opt = wrap(model)
    assert opt._doorbell is not None
    step_without_gradient(opt, model)  # starts the responders; the actives exchange once
    WORLD.Barrier()
    time.sleep(0.1)  # past the responder's polling after the last exchange
    before = 0 if ACTIVE else opt._responder.wakeups
    time.sleep(1.0)  # nobody exchanges
    if not ACTIVE:
        woken = opt._responder.wakeups - before
        assert woken <= 1.0 / MAX_WAIT_S + 5, woken
    WORLD.Barrier()
    step_without_gradient(opt, model)
    hvd.join()
    counts = WORLD.allgather(opt.exchanges)
    opt.close()
    assert sum(counts[p] for p in PASSIVES) == 2 * len(ACTIVES)


def test_a_passive_step_waits_for_an_averaging_not_for_a_transfer():
    """Active rank 0 sends an exchange's header, then its tensor only 2.5 s later (a slow
    link): meanwhile passive rank 1's step (which takes the model lock) goes on at once,
    and the exchange still ends with both ranks holding the mean of what they held."""
    import threading
    from ripples.torch import adpsgd_exchange as ex
    if N < 2:
        pytest.skip("a world of one has no passive rank")
    comm = WORLD.Dup()
    tensor = torch.full((1000,), float(R))
    if R == 0:
        header = np.array([ex.EXCHANGE, ex.layout_of([tensor]), 1, 0], dtype=np.int64)
        comm.Send(header, 1, ex.TAG_HEADER)
        time.sleep(2.5)
        comm.Send(tensor.numpy(), 1, ex.TAG_DATA)
        status = np.zeros(1, dtype=np.int64)
        comm.Recv(status, 1, ex.TAG_STATUS)
        comm.Recv(tensor.numpy(), 1, ex.TAG_AVERAGE)
        assert status[0] == ex.OK
        comm.Send(np.array([ex.DONE, 0, 0, 1], dtype=np.int64), 1, ex.TAG_HEADER)
    elif R == 1:
        lock = threading.Lock()
        responder = ex.Responder(comm, 1, [0], lock, lambda: [tensor], lambda active: None,
                                 timeout_s=20.0, stall_s=20.0)
        responder.start()
        while responder.served == 0:  # until the exchange is averaged
            start = time.monotonic()
            with lock:  # the passive's optimizer step
                waited = time.monotonic() - start
            assert waited < 1.0, f"the step waited {waited:.2f} s for the model lock"
            time.sleep(0.05)
        responder.wait()
        assert responder.served == 1
    if R < 2:
        assert torch.equal(tensor, torch.full((1000,), 0.5)), tensor[:3]
    comm.Barrier()
    comm.Free()


def test_join_with_uneven_steps_leaves_no_message_behind_and_training_goes_on():
    """Two rounds of uneven work, each ended by a join (one per epoch, as in Horovod): the
    second round trains and exchanges as the first, and no message is left unmatched."""
    model = Point(torch.full((3,), float(R), dtype=torch.float64), torch.zeros(2))
    opt = wrap(model, lr=0.01)
    for _ in range(2):
        for _ in range(3 + 4 * R):
            opt.zero_grad()
            (model.wide.square().sum() + model.narrow.square().sum()).backward()
            opt.step()
        last = hvd.join()
        assert 0 <= last < N
    WORLD.Barrier()
    assert not opt._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)  # every message was matched
    counts = WORLD.allgather((ACTIVE, opt.exchanges, opt.metrics.steps))
    opt.close()
    opt.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        opt.step()
    assert [c[2] for c in counts] == [2 * (3 + 4 * r) for r in range(N)]
    assert sum(c for a, c, _ in counts if a) == sum(c for a, c, _ in counts if not a)
    assert sum(c for a, c, _ in counts if a) == (2 * sum(3 + 4 * r for r in ACTIVES)
                                                   if PASSIVES else 0)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == N  # the runtime still works


def test_state_dict_round_trip_keeps_the_counters():
    model = Point(torch.zeros(2, dtype=torch.float64), torch.zeros(1))
    opt = wrap(model, lr=0.1)
    for _ in range(3):
        step_without_gradient(opt, model)
    state = opt.state_dict()
    opt.close()
    model = Point(torch.zeros(2, dtype=torch.float64), torch.zeros(1))
    opt = wrap(model, lr=0.1)
    opt.load_state_dict(state)
    assert state["ripples"]["steps"] == 3
    if ACTIVE:
        assert state["ripples"]["syncs"] == (3 if PASSIVES else 0)
    step_without_gradient(opt, model)
    hvd.join()
    assert opt.state_dict()["ripples"]["steps"] == 4
    if ACTIVE:
        assert opt.exchanges == (4 if PASSIVES else 0)
    opt.close()


def test_schedule_is_rejected():
    model = Point(torch.zeros(1, dtype=torch.float64), torch.zeros(1))
    with pytest.raises(ValueError, match="own pairing"):
        wrap(model, schedule="static")
