"""Pure logic of CASP (communities, sort-and-cut, controller) and of the EPSP/FlexRR task
board (shares, claims, transfers, exactly-once accounting), no processes."""
import itertools
import random
import time
import types

import pytest
import torch

from ripples.ps import casp, casp_scoring, epsp
from ripples.ps import policies as po
from ripples.ps import tasks as tk


def test_sort_and_cut_recovers_two_speed_classes_wherever_they_sit():
    rng = random.Random(5)
    for _ in range(20):
        speeds = [1, 1, 1, 1, 1 / 3, 1 / 3, 1 / 3, 1 / 3]
        rng.shuffle(speeds)
        times = [1 / s * rng.uniform(0.97, 1.03) for s in speeds]  # measured, with noise
        slow = tuple(w for w, s in enumerate(speeds) if s < 1)
        fast = tuple(w for w, s in enumerate(speeds) if s == 1)
        assert set(casp.choose(times)) == {fast, slow}
        assert set(casp.sort_and_cut(times, 2)) == {fast, slow}


def test_choose_keeps_equal_workers_together_and_isolates_a_slow_one():
    assert casp.choose([1.0] * 8) == (tuple(range(8)),)  # homogeneous: BSP
    assert casp.choose([1, 1, 1, 3, 1, 1, 1, 1]) == ((0, 1, 2, 4, 5, 6, 7), (3,))


def test_choose_runs_one_program_for_every_count_with_the_same_plans():
    """choose() cuts for all counts in one dynamic program; each plan must be the one
    sort_and_cut() finds for its count alone, ties included (few distinct times)."""
    rng = random.Random(3)
    for _ in range(100):
        times = [rng.choice([1.0, 1.5, 2.0, 3.0]) for _ in range(rng.randint(1, 11))]
        together = casp_scoring._cuts(times, 1, len(times))
        assert together == {c: casp.sort_and_cut(times, c) for c in range(1, len(times) + 1)}


def test_sort_and_cut_extremes_and_bad_counts():
    times = [3.0, 1.0, 2.0]
    assert casp.sort_and_cut(times, 1) == ((0, 1, 2),)
    assert casp.sort_and_cut(times, 3) == ((0,), (1,), (2,))
    assert casp.sort_and_cut([1.0] * 6, 2) == ((0, 1, 2), (3, 4, 5))  # ties: even sizes
    for bad in (0, 4):
        with pytest.raises(ValueError, match="communities"):
            casp.sort_and_cut(times, bad)


def test_projection_prefers_communities_over_bsp_and_asp_for_two_classes():
    times = [1, 1, 1, 1, 3, 3, 3, 3]
    two = casp.sort_and_cut(times, 2)
    one, each = casp.sort_and_cut(times, 1), casp.sort_and_cut(times, 8)
    assert casp.projected_score(times, two) > casp.projected_score(times, one)
    assert casp.projected_score(times, two) > casp.projected_score(times, each)
    # The traffic penalty alone: for equal workers, ASP's score is its progress cut by
    # 10% (one push per batch), BSP's by 10% / 8 (one push per 8 batches).
    ones = [1.0] * 8
    assert casp.projected_score(ones, casp.sort_and_cut(ones, 1)) == pytest.approx(8 * (1 - 0.1 / 8))


def test_controller_regroups_only_after_every_community_made_its_rounds():
    state = casp.Controller(num_workers=4, count=None, regroup_every=2)
    assert state.plan == ((0, 1, 2, 3),) and state.version == 0
    times = {0: 0.1, 1: 0.1, 2: 0.3, 3: 0.3}
    casp.observe(state, 0, (0, 1, 2, 3), times)
    assert not casp.regroup(state)  # one round of two
    casp.observe(state, 0, (0, 1, 2, 3), times)
    assert casp.regroup(state)
    assert state.plan == ((0, 1), (2, 3)) and state.version == 1
    for _ in range(5):  # only the fast community pushes: no decision yet
        casp.observe(state, 1, (0, 1), times)
    casp.observe(state, 0, (0, 1, 2, 3), times)  # a late push under the old plan counts not
    assert not casp.regroup(state) and state.version == 1
    casp.observe(state, 1, (2, 3), times)
    casp.observe(state, 1, (2, 3), times)
    assert not casp.regroup(state) and state.version == 1  # same plan: not re-issued
    assert state.rounds == {}
    fixed = casp.Controller(num_workers=4, count=3, regroup_every=1)
    assert fixed.plan == ((0,), (1,), (2, 3))  # bounds 4k//3 = 0, 1, 2, 4


def test_plan_wire_form_round_trips():
    plan = ((0, 3), (1,), (2, 4, 5))
    assert casp.from_labels(casp.labels(plan, 6)) == plan


@pytest.mark.parametrize("times,total,expected", [
    ([1, 1, 1], 9, [3, 3, 3]),
    ([1, 3], 8, [6, 2]),  # 6 x 1 s and 2 x 3 s: a seventh task on worker 0 would take 7 s
    # one each, then the fast ones fill up to 3 s; the last two go to workers 0 and 1 (4 s)
    # rather than to the slow one (2 x 3 = 6 s)
    ([1, 1, 1, 1, 1, 1, 1, 3], 24, [4, 4, 3, 3, 3, 3, 3, 1]),
    ([1] * 7 + [3], 44, [6, 6, 6, 6, 6, 6, 6, 2]),  # 6 s each
    ([0.01, 1, 1], 4, [2, 1, 1]),  # at least one task each
])
def test_shares_follow_speed_minimize_the_clock_and_keep_the_global_batch(times, total,
                                                                          expected):
    shares = tk.balanced_shares(times, total)
    assert shares == expected and sum(shares) == total
    with pytest.raises(ValueError, match="tasks_per_clock"):
        tk.balanced_shares(times, len(times) - 1)


def board(staleness=0, rule="projection"):
    b = tk.TaskBoard(num_workers=2, tasks_per_clock=4, staleness=staleness,
                     rebalance_every=None, rule=rule)
    tk.observe(b, 0, 1.0)
    tk.observe(b, 1, 3.0)  # worker 1 is a straggler
    return b


def one(b, worker, clock):
    """Claim a single task; None when the worker's share is gone."""
    granted = tk.claim(b, worker, clock)
    return granted[0] if granted else None


def test_transfer_race_the_straggler_claims_first():
    b = board()
    assert [one(b, 0, 0), one(b, 0, 0), one(b, 0, 0)] == [(0, 0), (0, 1), None]
    assert one(b, 1, 0) == (0, 2)
    assert one(b, 1, 0) == (0, 3)  # the straggler starts its last task first...
    assert tk.steal(b, 0, 0, rounds_complete=0) is None  # ...so nothing is left to move
    assert not tk.complete(b, 0, 0, [0, 1])
    assert tk.complete(b, 1, 0, [2, 3])


def test_transfer_race_the_pioneer_steals_first():
    b = board()
    one(b, 0, 0), one(b, 0, 0)
    assert one(b, 1, 0) == (0, 2)
    assert tk.steal(b, 0, 0, rounds_complete=0) == (0, 3)  # moved to the pioneer...
    assert one(b, 1, 0) is None  # ...so the straggler's own claim finds it gone
    with pytest.raises(ValueError, match=r"task \(0, 3\) completed by worker 1 but claimed by 0"):
        tk.complete(b, 1, 0, [3])
    assert not tk.complete(b, 1, 0, [2])
    assert tk.complete(b, 0, 0, [0, 1, 3])
    with pytest.raises(ValueError, match=r"task \(0, 3\) completed twice"):
        tk.complete(b, 0, 0, [3])
    assert b.stats["transfers"] == 1 and b.stats["transfer_log"] == [(0, 3, 1, 0)]


def test_batched_claims_take_the_front_of_the_queue_and_report_what_is_left():
    b = tk.TaskBoard(num_workers=2, tasks_per_clock=10, staleness=0, rebalance_every=None)
    assert tk.claim(b, 0, 0, count=3) == [(0, 0), (0, 1), (0, 2)]
    assert tk.unclaimed(b, 0, 0) == 2 and tk.unclaimed(b, 1, 0) == 5
    assert tk.claim(b, 0, 0, count=3) == [(0, 3), (0, 4)]  # only two were left
    assert tk.claim(b, 0, 0, count=3) == [] and tk.unclaimed(b, 0, 0) == 0
    assert tk.claim(b, 1, 1, count=2) == [(1, 5), (1, 6)]  # opens clock 1
    with pytest.raises(ValueError, match="count"):
        tk.claim(b, 1, 0, count=0)


def test_a_batch_claim_racing_a_steal_splits_the_queue_without_overlap():
    # Worker 1 (3 s per task) holds 2 of its 4 tasks; the pioneer's steal and the owner's
    # next batch claim race for the rest, in either order on server 0.
    for steal_first in (True, False):
        b = tk.TaskBoard(num_workers=2, tasks_per_clock=8, staleness=0, rebalance_every=None)
        tk.observe(b, 0, 1.0)
        tk.observe(b, 1, 3.0)
        assert tk.claim(b, 0, 0, count=4) == [(0, 0), (0, 1), (0, 2), (0, 3)]
        assert tk.claim(b, 1, 0, count=2) == [(0, 4), (0, 5)]
        if steal_first:
            assert tk.steal(b, 0, 0, 0) == (0, 7)  # 2 left x 3 s > 1.2 x 1 s
            assert tk.claim(b, 1, 0, count=4) == [(0, 6)]
            mine = [4, 5, 6]
        else:
            assert tk.claim(b, 1, 0, count=4) == [(0, 6), (0, 7)]
            assert tk.steal(b, 0, 0, 0) is None  # the owner has started everything
            mine = [4, 5, 6, 7]
        theirs = [0, 1, 2, 3] + ([7] if steal_first else [])
        assert sorted(mine + theirs) == list(range(8))
        with pytest.raises(ValueError, match="claimed by"):
            tk.complete(b, 0, 0, [4])  # a task held by the owner cannot be pushed by another
        assert not tk.complete(b, 0, 0, theirs)
        assert tk.complete(b, 1, 0, mine)
        with pytest.raises(ValueError, match="completed twice"):
            tk.complete(b, 1, 0, mine[-1:])


def test_exactly_once_under_random_interleavings_of_batch_claims_and_steals():
    rng = random.Random(5)
    for trial in range(200):
        workers, total = rng.randint(2, 4), rng.randint(4, 20)
        b = tk.TaskBoard(num_workers=workers, tasks_per_clock=max(total, workers),
                         staleness=0, rebalance_every=None)
        for w in range(workers):
            tk.observe(b, w, rng.choice([0.5, 1.0, 3.0]))
        got = {w: [] for w in range(workers)}
        for _ in range(10 * b.tasks_per_clock):
            w = rng.randrange(workers)
            if rng.random() < 0.6:
                got[w] += tk.claim(b, w, 0, count=rng.randint(1, 4))
            elif tk.unclaimed(b, w, 0) == 0:
                moved = tk.steal(b, w, 0, 0, ahead=rng.randint(0, 1))
                got[w] += [moved] if moved else []
        for w in range(workers):  # every owner drains what is left of its queue
            got[w] += tk.claim(b, w, 0, count=b.tasks_per_clock)
        every = sorted(t for tasks in got.values() for t in tasks)
        assert every == [(0, j) for j in range(b.tasks_per_clock)], trial
        results = [tk.complete(b, w, 0, [j for _, j in got[w]]) for w in range(workers)]
        assert results[-1] and b.clocks[0].done == set(range(b.tasks_per_clock)), trial


def test_claim_batches_cover_one_round_trip_and_refill_at_half():
    assert [epsp.claim_count(n, None, None) for n in (0, 1, 2)] == [2, 1, 0]  # unmeasured
    # a 15 ms round trip hides behind 2 tasks of 8 ms: hold up to 4, claim at 2 or fewer
    assert [epsp.claim_count(n, 0.008, 0.015) for n in (0, 1, 2, 3)] == [4, 3, 2, 0]
    assert epsp.claim_count(0, 0.030, 0.015) == 2  # slow tasks: one covers the trip
    assert epsp.claim_count(0, 0.001, 1.0) == epsp.MAX_AHEAD  # a slow link: bounded


def test_a_pioneer_still_busy_needs_a_larger_gain_to_move_a_task():
    b = board()
    one(b, 0, 0), one(b, 0, 0), one(b, 1, 0)
    # worker 1: one task left x 3 s; worker 0: 1 s per task
    assert tk.steal(b, 0, 0, 0, ahead=2) is None  # 3 s does not exceed 1.2 x 3 x 1 s
    assert tk.steal(b, 0, 0, 0, ahead=1) == (0, 3)  # 3 s exceeds 1.2 x 2 x 1 s


def test_no_transfer_when_it_would_not_shorten_the_clock_or_nothing_blocks():
    b = board()
    tk.observe(b, 1, 1.0)
    tk.observe(b, 1, 1.0)  # EMA 3 -> 2.4 -> 1.98 s, one task left
    one(b, 0, 0), one(b, 0, 0), one(b, 1, 0)
    assert tk.steal(b, 0, 0, 0) == (0, 3)  # 1.98 s projected > 1.2 x 1 s: worth it
    b = board()
    for w in (0, 0, 1):
        one(b, w, 0)
    for _ in range(4):
        tk.observe(b, 1, 0.5)  # EMA 3 -> 2.25 -> 1.73 -> 1.36 -> 1.10 s
    assert tk.steal(b, 0, 0, 0) is None  # 1.10 s does not exceed 1.2 x 1 s
    tk.observe(b, 1, 3.0)  # 1.67 s: now it does
    assert tk.steal(b, 0, 0, 0) == (0, 3)
    b = board()
    for w in (0, 0, 1):
        one(b, w, 0)
    one(b, 1, 0)  # the straggler's queue is empty
    assert tk.steal(b, 0, 0, 0) is None
    slack = board(staleness=1)
    one(slack, 0, 0), one(slack, 0, 0), one(slack, 1, 0)
    assert tk.steal(slack, 0, 0, rounds_complete=0) is None  # may start clock 1: no block
    one(slack, 0, 1), one(slack, 0, 1)
    assert tk.steal(slack, 0, 1, rounds_complete=0) == (0, 3)  # blocked on clock 0


def test_flexrr_lite_moves_by_count_without_times():
    b = tk.TaskBoard(num_workers=3, tasks_per_clock=6, staleness=0, rebalance_every=None,
                     rule="most_remaining")
    one(b, 0, 0), one(b, 0, 0), one(b, 2, 0)
    assert tk.steal(b, 0, 0, 0) == (0, 3)  # worker 1 has two unclaimed, worker 2 one
    assert tk.steal(b, 0, 0, 0) is None  # one left each: FlexRR-lite leaves it
    with pytest.raises(ValueError, match="rule"):
        tk.TaskBoard(num_workers=2, tasks_per_clock=2, staleness=0, rebalance_every=None,
                     rule="random")


def test_rebalancing_once_measured_then_every_k_clocks():
    b = tk.TaskBoard(num_workers=2, tasks_per_clock=8, staleness=0, rebalance_every=2)
    tk.open_through(b, 0)
    tk.observe(b, 0, 1.0)
    tk.open_through(b, 1)  # worker 1 not measured yet: equal shares stay
    tk.observe(b, 1, 3.0)
    tk.open_through(b, 2)  # both measured: 6 tasks of 1 s against 2 of 3 s
    b.task_time[1] = 1.0
    tk.open_through(b, 4)  # clock 3 is one clock after the rebalance; clock 4 is two
    assert [s for _, s in b.stats["shares_log"]] == [[4, 4], [4, 4], [6, 2], [6, 2], [4, 4]]
    assert b.stats["rebalances"] == 2
    assert tk.stragglers([6.0, 2.0, 2.1], threshold=0.2) == [0]


def test_policy_arguments_are_named_when_wrong():
    assert po.make_spec("casp", 4).communities == "auto"
    assert po.make_spec("casp", 4, communities="learned").communities == "learned"
    assert po.make_spec("casp", 4, communities="projected").communities == "projected"
    assert po.make_spec("epsp", 4).staleness == 0
    assert po.make_spec("epsp", 4).tasks_per_clock == 16
    cases = [
        (dict(policy="casp", communities=0), "communities"),
        (dict(policy="casp", communities=5), "communities"),
        (dict(policy="casp", communities="learnt"), "communities"),
        (dict(policy="casp", regroup_every=0), "regroup_every"),
        (dict(policy="epsp", staleness=-1), "staleness"),
        (dict(policy="epsp", staleness=1.5), "staleness"),
        (dict(policy="epsp", tasks_per_clock=3), "tasks_per_clock"),
        (dict(policy="epsp", rebalance_every=0), "rebalance_every"),
        (dict(policy="bsp", communities=2), "communities applies only"),
        (dict(policy="flexrr", rebalance_every=2), "rebalance_every applies only"),
        (dict(policy="asp", staleness=1), "staleness applies only"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            po.make_spec(num_workers=4, **kwargs)


def test_pull_gates_of_the_new_policies():
    epsp = po.make_spec("epsp", 3, staleness=2)
    assert po.pull_ready(epsp, after_round=5, rounds_applied=3, own_pushes=0, active_pushes=[])
    assert not po.pull_ready(epsp, after_round=5, rounds_applied=2, own_pushes=0, active_pushes=[])
    free = po.make_spec("casp", 3)
    assert po.pull_ready(free, 1, 0, own_pushes=50, active_pushes=[50, 0])
    bounded = po.make_spec("casp", 3, staleness=1)
    assert not po.pull_ready(bounded, 1, 0, own_pushes=3, active_pushes=[3, 1])
    assert po.pull_ready(bounded, 1, 0, own_pushes=3, active_pushes=[3, 2])


class Link:
    """Server 0's task board behind a link that holds requests until ``deliver``, in order
    (the workers' side of ``TaskRunner`` runs unchanged against it)."""

    def __init__(self, b):
        self.board, self.queue, self.answers = b, [], {}
        self.log = []  # (worker, message, or ("pull", after)) in the order sent

    def deliver(self):
        for worker, m in self.queue:
            if m["steal"]:
                moved = tk.steal(self.board, worker, m["clock"], 0, m["ahead"])
                granted = [moved] if moved else []
            else:
                granted = tk.claim(self.board, worker, m["clock"], m["count"])
            self.answers[(worker, m["rid"])] = {
                "tasks": granted, "left": tk.unclaimed(self.board, worker, m["clock"]),
                "_arrived": time.monotonic()}
        self.queue = []

    def worker(self, w):
        link, ids = self, itertools.count(1)

        class Channel:
            def send(self, server, message):
                message["rid"] = next(ids)
                link.queue.append((w, dict(message)))
                link.log.append((w, dict(message)))
                return message["rid"]

            def poll(self, server, rid):
                return link.answers.pop((w, rid), None)

            def wait(self, server, rid, timeout_s, what):
                link.deliver()
                return link.answers.pop((w, rid))

        params = [torch.nn.Parameter(torch.zeros(1))]
        ps = types.SimpleNamespace(worker=w, sid=1, clock=0, timeout_s=5.0, params=params,
                                   rounds_known=0, spec=types.SimpleNamespace(
                                       tasks_per_clock=self.board.tasks_per_clock,
                                       staleness=self.board.staleness),
                                   channel=Channel(),
                                   request_pull=lambda after: link.log.append((w, ("pull", after))))
        return epsp.TaskRunner(ps)


@pytest.mark.parametrize("deliver_every_tick", [True, False])
def test_workers_compute_every_task_once_while_the_pioneer_takes_the_stragglers(
        deliver_every_tick):
    b = tk.TaskBoard(num_workers=2, tasks_per_clock=12, staleness=0, rebalance_every=None)
    tk.observe(b, 0, 0.01)
    tk.observe(b, 1, 1.0)  # worker 1 is 100x slower: it computes once every 4 ticks
    link = Link(b)
    runners = [link.worker(0), link.worker(1)]
    loops = {w: iter(r.tasks()) for w, r in enumerate(runners)}
    started = {0: [], 1: []}
    tick = 0
    while loops:
        for w in list(loops):
            if w == 1 and tick % 4:
                continue
            try:
                started[w].append(next(loops[w]))
            except StopIteration:
                del loops[w]
        if deliver_every_tick:
            link.deliver()
        tick += 1
    every = sorted(started[0] + started[1])
    assert every == [(0, j) for j in range(12)]
    assert runners[0].stats["stolen"] > 0 and runners[1].stats["stolen"] == 0
    for w in (0, 1):
        assert sorted(runners[w].ids[0]) == sorted(j for _, j in started[w])
    assert not tk.complete(b, 0, 0, runners[0].ids[0])
    assert tk.complete(b, 1, 0, runners[1].ids[0])


@pytest.mark.parametrize("clock,asks_a_move", [(0, False), (2, True)])
def test_a_move_is_asked_only_when_the_gate_may_block(clock, asks_a_move):
    # Slack 2, no round applied as far as worker 0 knows: after clock 0 the gate cannot
    # block it (clock 1 needs round -1); after clock 2 it may (clock 3 needs round 1).
    b = tk.TaskBoard(num_workers=2, tasks_per_clock=4, staleness=2, rebalance_every=None)
    tk.observe(b, 0, 1.0)
    tk.observe(b, 1, 3.0)  # worker 1's 2 unclaimed tasks of clock 0: 6 s projected
    link = Link(b)
    runner = link.worker(0)
    runner.ps.clock = clock
    started = list(runner.tasks())
    moves = [m for _, m in link.log if isinstance(m, dict) and m["steal"]]
    assert bool(moves) == asks_a_move
    # The fake server moves by the board alone (rounds applied 0), so asked moves are
    # granted: worker 1's unclaimed tasks (6 s, then 3 s, against 2.4 s), first of the
    # clock worker 0 waits for, then of the later ones up to its own.
    assert started[2:] == ([(0, 3), (0, 2), (1, 3), (1, 2), (2, 3), (2, 2)]
                           if asks_a_move else [])


@pytest.mark.parametrize("staleness", [0, 2])
def test_the_next_clock_is_claimed_and_pulled_while_the_last_task_computes(staleness):
    b = tk.TaskBoard(num_workers=2, tasks_per_clock=6, staleness=staleness,
                     rebalance_every=None)
    link = Link(b)
    runner = link.worker(0)
    seen_at_last_task = None
    for n, task in enumerate(runner.tasks(), start=1):
        if n == 3:  # its whole share, claimed; nothing else known
            seen_at_last_task = list(link.log)
    next_claims = [m for _, m in seen_at_last_task
                   if isinstance(m, dict) and not m["steal"] and m["clock"] == 1]
    pulls = [m for _, m in seen_at_last_task if isinstance(m, tuple)]
    assert len(next_claims) == 1 and next_claims[0]["count"] >= 1
    assert pulls == ([("pull", 1)] if staleness else [])


def test_a_worker_is_paused_from_its_paused_round_until_it_trains_again():
    paused = casp.paused_after(set(), [0, 1], [0], leaving=set())
    assert paused == {0}  # worker 1 trained in that round; worker 0 waits for it
    paused = casp.paused_after(paused, [2, 3], [], leaving=set())
    assert paused == {0}  # another community's training rounds do not resume worker 0
    paused = casp.paused_after(paused, [0, 1], [0, 1], leaving=set())
    assert paused == {0, 1}
    paused = casp.paused_after(paused, [0, 1, 2], [], leaving={2})
    assert paused == set()  # 0 and 1 train again; 2 only leaves
    assert casp.paused_after({2}, [0, 2], [], leaving={2}) == {2}
