"""Group Generator invariants, deadlock freedom and heterogeneity, in emulated time."""
import random

import pytest

from ripples.schedule import GroupGenerator
from ripples.schedule.generator import divide, divide_by_node
from ripples.schedule.mixing import (expected_random_division_eigenvalue,
                                     random_division_eigenvalue)
from ripples.schedule.simulate import DeadlockError, SimClock, simulate


def assert_consistent(executed):
    """Per worker strictly increasing seq; every group executed by exactly its members;
    so any two workers meet their shared groups in the same order."""
    members = {}
    for worker, pairs in executed.items():
        seqs = [seq for seq, _ in pairs]
        assert seqs == sorted(set(seqs)), worker
        for seq, group in pairs:
            assert worker in group
            members.setdefault((seq, group), []).append(worker)
    assert len({seq for seq, _ in members}) == len(members)  # one group per seq
    for (seq, group), who in members.items():
        assert sorted(who) == list(group), (seq, group, who)


def test_divide_never_leaves_a_trailing_worker_alone():
    assert divide([5, 1, 3, 0, 2], 2) == [(1, 5), (0, 2, 3)]
    assert divide([4], 2) == [(4,)]
    assert divide([3, 1, 2], 3) == [(1, 2, 3)]


def test_all_policy_fills_every_buffer_and_requests_pop_the_head():
    now = [0.0]
    gen = GroupGenerator(6, 3, seed=1, policy="all", clock=lambda: now[0])
    gen.request(4)
    answer = gen.poll()
    assert list(answer) == [4]
    ((seq, group),) = answer[4]
    assert seq in (0, 1) and 4 in group and len(group) == 3
    gen.request(0)  # 0 already holds a group of that division: popped, no new division
    ((seq0, group0),) = gen.poll()[0]
    assert seq0 in (0, 1) and 0 in group0 and gen.divisions == 1
    # one division = a partition of everyone into two numbered groups
    assert (group0 == group) == (seq0 == seq)
    assert group0 == group or sorted(group0 + group) == list(range(6))
    assert gen.leave(0) == [] and 0 not in gen.active
    remaining = gen.leave(5)
    assert len(remaining) == 1 and 5 in remaining[0][1]  # its buffered group comes back


def test_ready_policy_waits_for_expected_workers_then_divides_the_ready_ones():
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="ready", first_wait_s=0.5, clock=lambda: now[0])
    gen.request(0)
    assert gen.poll() == {}  # others' speeds unknown: wait for them
    assert gen.next_deadline() == 0.5
    now[0] = 0.1
    gen.request(2)
    assert gen.poll() == {}
    now[0] = 0.5  # window of worker 0 expired: divide the two ready workers only
    answers = gen.poll()
    assert answers == {0: [(0, (0, 2))], 2: [(0, (0, 2))]}


def test_ready_policy_slow_worker_waits_for_fast_ones_but_not_the_reverse():
    now = [0.0]
    gen = GroupGenerator(3, 2, seed=0, policy="ready", window_fraction=0.5,
                         clock=lambda: now[0])

    def at(t, *workers):
        now[0] = t
        for w in workers:
            gen.request(w)
        return gen.poll()

    assert set(at(0.0, 0, 1, 2)) == {0, 1, 2}  # everyone ready: one division
    assert at(1.0, 0, 1) == {}  # speed of worker 2 unknown yet: it may come soon
    assert set(at(1.5)) == {0, 1}  # window of the fast workers (0.5 * 1 s) expired
    # worker 2 (interval 2 s) is ready; fast workers are expected at t=2: it waits
    assert at(2.0, 2) == {}
    answers = at(2.0, 0, 1)
    assert answers[2] == [(2, (0, 1, 2))]  # the trailing worker joins the last group
    # fast workers ready at t=3; worker 2 is expected only at t=4, after their window
    assert at(3.0, 0, 1) == {0: [(3, (0, 1))], 1: [(3, (0, 1))]}


def test_isolated_worker_is_forced_into_the_next_division():
    now = [0.0]
    gen = GroupGenerator(2, 2, seed=0, policy="ready", max_isolation=1, first_wait_s=0.0,
                         clock=lambda: now[0])
    gen.request(0)
    assert gen.poll() == {0: [(0, (0,))]}  # nobody else ready by its deadline: alone once
    gen.request(0)
    now[0] = 0.5
    assert gen.poll() == {}  # must wait for company now, at most company_wait_s (1.0)
    assert gen.next_deadline() == pytest.approx(1.0)
    gen.request(1)
    assert gen.poll() == {0: [(1, (0, 1))], 1: [(1, (0, 1))]}


def test_wait_for_company_is_bounded():
    """Others may be blocked on something the generator cannot see: after company_wait_s
    the isolated worker gets a group of itself rather than waiting forever."""
    now = [0.0]
    gen = GroupGenerator(2, 2, seed=0, policy="ready", max_isolation=1, first_wait_s=0.0,
                         company_wait_s=2.0, clock=lambda: now[0])
    gen.request(0)
    assert gen.poll() == {0: [(0, (0,))]}
    now[0] = 10.0
    gen.request(0)
    now[0] = 11.9
    assert gen.poll() == {}
    now[0] = 12.0
    assert gen.poll() == {0: [(1, (0,))]}


def test_a_worker_away_from_training_is_not_waited_for():
    """Workers in a collective of the script (or done with their epoch) told the generator
    so: an isolated worker gets a group of itself at once instead of waiting for company."""
    now = [0.0]
    gen = GroupGenerator(3, 2, seed=0, max_isolation=1, first_wait_s=0.0,
                         company_wait_s=30.0, clock=lambda: now[0])
    gen.away(1)
    gen.away(2)
    gen.request(0)
    assert gen.poll() == {0: [(0, (0,))]}  # alone once, nobody to wait for
    gen.request(0)
    assert gen.poll() == {0: [(1, (0,))]}  # and again: the others cannot come
    assert gen.present == [0] and gen.active == [0, 1, 2]
    gen.request(1)  # back from its collective
    assert gen.present == [0, 1]
    gen.request(0)
    assert gen.poll() == {0: [(2, (0, 1))], 1: [(2, (0, 1))]}


def test_an_isolated_worker_waits_for_company_only_while_it_may_come():
    """Others known to ask every second are waited for until they are overdue (two of their
    intervals without a request), not for company_wait_s."""
    now = [0.0]
    gen = GroupGenerator(2, 2, seed=0, max_isolation=1, first_wait_s=0.0,
                         company_wait_s=30.0, clock=lambda: now[0])
    for t in (0.0, 1.0):  # both ask every second, together
        now[0] = t
        gen.request(0)
        gen.request(1)
        assert set(gen.poll()) == {0, 1}
    now[0] = 1.2  # worker 0 alone; worker 1 is expected at 2.0, after 0's window (0.1 s)
    gen.request(0)
    assert gen.poll() == {0: [(2, (0,))]}  # alone once
    gen.request(0)
    assert gen.poll() == {}  # must have company: worker 1 is expected at 2.0
    assert gen.next_deadline() == pytest.approx(3.0)  # when worker 1 becomes overdue
    now[0] = 2.9
    assert gen.poll() == {}
    now[0] = 3.0  # worker 1 never came: it is doing something else
    assert gen.poll() == {0: [(3, (0,))]}


def test_away_is_ignored_while_a_request_is_outstanding_and_after_leaving():
    now = [0.0]
    gen = GroupGenerator(2, 2, seed=0, first_wait_s=1.0, clock=lambda: now[0])
    gen.request(0)
    gen.away(0)  # it is waiting for its groups, so it is not away
    assert gen.present == [0, 1]
    gen.leave(1)
    gen.away(1)
    assert gen.present == [0]
    assert gen.poll() == {0: [(0, (0,))]}  # nobody else present: divided at once


def test_all_policy_ignores_presence():
    """'all' divides every active worker: its buffered groups must run in one order on
    every rank, which leaving someone out would break for two generators side by side."""
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="all", clock=lambda: now[0])
    gen.away(3)
    assert gen.present == [0, 1, 2, 3]
    gen.request(0)
    gen.poll()
    assert any(3 in g for _, g in gen._workers[3].fifo) and gen.divisions == 1


def test_left_worker_is_never_assigned_again():
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="all", batch=3, clock=lambda: now[0])
    gen.request(1)
    gen.poll()
    remaining = gen.leave(2)
    assert len(remaining) == 3 and all(2 in g for _, g in remaining)
    for _ in range(20):
        for w in (0, 1, 3):
            gen.request(w)
            for pairs in gen.poll().values():
                assert all(2 not in g for s, g in pairs if s >= 6)  # 6 groups before the leave
    with pytest.raises(ValueError, match="has left"):
        gen.request(2)


def test_workers_that_all_left_are_counted_again_after_rejoin():
    """After a join every worker has left; rejoin() brings each back into the divisions
    (the 'all' policy groups exactly the active workers), its request interval afresh."""
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="all", clock=lambda: now[0])
    for now[0] in (0.0, 1.0):  # one step of 1 s
        for w in range(4):
            gen.request(w)
            gen.poll()
    assert gen.speed_estimate(1) == 1.0
    for w in range(4):
        gen.leave(w)
    assert gen.active == [] and gen.present == []
    now[0] = 100.0  # an evaluation between the epochs
    gen.rejoin(1)
    gen.rejoin(3)
    gen.rejoin(3)  # already back: nothing changes
    assert gen.active == [1, 3] and gen.present == [1, 3]
    gen.request(1)
    ((_, group),) = gen.poll()[1]
    assert group == (1, 3)  # the workers still away from the step are not grouped
    assert gen.speed_estimate(1) == 1.0  # the 99 s away are not a step time
    with pytest.raises(ValueError, match="has left"):
        gen.request(0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(policy="fastest"), "policy must be one of 'ready', 'all'"),
    (dict(group_size=0), r"group_size must be >= 1 and <= size \(8\), got 0"),
    (dict(batch=0), "batch must be >= 1"),
    (dict(ema_alpha=0), "ema_alpha must be in"),
    (dict(window_fraction=-1), "window_fraction must be a number >= 0"),
    (dict(ranks_per_node=0), "ranks_per_node must be >= 1"),
    (dict(cross_node_every=0), "cross_node_every must be >= 1"),
])
def test_generator_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GroupGenerator(**(dict(size=8, group_size=2) | kwargs))


def run(size, group_size, policy, step_time, stop, seed=0, comm_time=0.001, **options):
    clock = SimClock()
    gen = GroupGenerator(size, group_size, seed=seed, policy=policy, clock=clock, **options)
    return simulate(gen, clock, step_time, stop, comm_time=comm_time)


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("policy,batch", [("ready", 1), ("all", 1), ("all", 3), ("ready", 2)])
def test_ten_thousand_groups_with_random_delays_never_deadlock(size, policy, batch):
    rng = random.Random(size * 10 + batch)
    per_group = 2 if size == 8 else 1  # steps per group on average, groups of 2
    steps = {w: rng.randint(5000, 6000) // per_group for w in range(size)}  # leave at different times
    result = run(size, 2, policy, lambda w, s: rng.expovariate(1.0) * (1 + w % 3),
                 lambda w, done, now: done >= steps[w], batch=batch, seed=size)
    assert result.steps == steps
    assert result.groups >= 10_000
    assert_consistent(result.executed)


def test_simulator_detects_a_waiting_cycle():
    class Crossed(GroupGenerator):  # hands out two shared groups in opposite orders
        def poll(self):
            answers = super().poll()
            if 1 in answers:
                answers[1] = list(reversed(answers[1]))
            return answers
    clock = SimClock()
    gen = Crossed(2, 2, policy="all", batch=2, clock=clock)
    with pytest.raises(DeadlockError, match="no event can happen"):
        simulate(gen, clock, lambda w, s: 1.0, lambda w, done, now: done >= 3)


def test_ready_policy_keeps_fast_workers_free_of_a_slow_one():
    # 8 workers, worker 7 five times slower: ceiling sum(v) = 7.2 steps/s, n*min(v) = 1.6
    speeds = [1.0] * 7 + [0.2]
    ceiling = sum(speeds)
    results = {}
    for policy in ("ready", "all"):
        rng = random.Random(1)
        results[policy] = run(8, 2, policy, lambda w, s: rng.uniform(0.95, 1.05) / speeds[w],
                              lambda w, done, now: now >= 200.0, comm_time=0.01)
        assert_consistent(results[policy].executed)
    assert results["ready"].throughput >= 0.85 * ceiling
    assert results["all"].throughput <= 0.3 * ceiling
    # the slow worker still averages with others, never alone for more than max_isolation
    # (default 2) groups in a row
    slow = results["ready"].executed[7]
    longest, run_ = 0, 0
    for _, g in slow:
        run_ = run_ + 1 if len(g) == 1 else 0
        longest = max(longest, run_)
    assert longest <= 2
    assert sum(len(g) >= 2 for _, g in slow) >= 0.5 * len(slow)


@pytest.mark.parametrize("group_size", [2, 4])
def test_random_division_mixing_matches_closed_form(group_size):
    expected = expected_random_division_eigenvalue(16, group_size)
    assert expected == pytest.approx({2: 0.467, 4: 0.200}[group_size], abs=1e-3)
    assert random_division_eigenvalue(16, group_size, samples=5000, seed=1) == \
        pytest.approx(expected, abs=0.025)


def _in_order(members):
    return list(members)


def test_divide_by_node_keeps_groups_on_their_node_outside_cross_divisions():
    # nodes of 4: {0..3}, {4..7}, {8..11}; node 2 has one ready worker, who must cross
    groups = divide_by_node([0, 1, 2, 3, 4, 5, 6, 9], 4, 2, _in_order, cross=False)
    assert groups == [(0, 1), (2, 3), (4, 5, 6), (9,)]


def test_divide_by_node_sends_one_representative_per_node_across():
    groups = divide_by_node(list(range(12)), 4, 2, _in_order, cross=True)
    # the first of every node crosses: (0, 4) and then 8 joins them (no trailing single)
    assert groups == [(1, 2, 3), (5, 6, 7), (9, 10, 11), (0, 4, 8)]
    crossing = [g for g in groups if len({w // 4 for w in g}) > 1]
    assert crossing == [(0, 4, 8)]  # each node's link carries one group


def test_divide_by_node_lets_a_worker_alone_on_its_node_stay_alone_outside_cross_divisions():
    # nodes of 2: {0}, {2}, {4, 5}, {6} ready; 0 may stay alone, 2 and 6 may not: they cross
    groups = divide_by_node([0, 2, 6, 4, 5], 2, 2, _in_order, cross=False,
                            may_stay_alone=lambda w: w == 0)
    assert groups == [(0,), (4, 5), (2, 6)]
    # a cross division sends one representative per node across (0, 2, 4, 6) and 5, left
    # alone, with them, whoever may stay alone: no group of one
    assert divide_by_node([0, 2, 6, 4, 5], 2, 2, _in_order, cross=True,
                          may_stay_alone=lambda w: True) == [(0, 2), (4, 5, 6)]


def test_node_aware_generator_steps_a_lone_node_worker_alone_then_crosses():
    """Workers 0 and 2 sit on different nodes, their node-mates are away: outside cross
    divisions each takes max_isolation steps alone (no group over the slow link), then
    they are divided across nodes together."""
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, max_isolation=2, first_wait_s=0.0, ranks_per_node=2,
                         cross_node_every=100, clock=lambda: now[0])
    gen.away(1)
    gen.away(3)
    answers = []
    for _ in range(4):
        now[0] += 1.0
        gen.request(0)
        gen.request(2)
        answers.append(gen.poll())
    assert answers == [{0: [(0, (0, 2))], 2: [(0, (0, 2))]},  # division 0 crosses nodes
                       {0: [(1, (0,))], 2: [(2, (2,))]},
                       {0: [(3, (0,))], 2: [(4, (2,))]},
                       {0: [(5, (0, 2))], 2: [(5, (0, 2))]}]  # alone twice: now across


@pytest.mark.parametrize("cross_node_every", [1, 3])
def test_node_aware_generator_keeps_the_invariants_and_mostly_stays_on_nodes(cross_node_every):
    rng = random.Random(cross_node_every)
    steps = {w: 400 for w in range(16)}
    result = run(16, 2, "all", lambda w, s: rng.expovariate(1.0),
                 lambda w, done, now: done >= steps[w], seed=1, ranks_per_node=4,
                 cross_node_every=cross_node_every)
    assert result.steps == steps
    assert_consistent(result.executed)
    groups = {pair for pairs in result.executed.values() for pair in pairs}
    crossing = sum(len({w // 4 for w in g}) > 1 for _, g in groups)
    # "all" divides all 16 workers at once. A cross division: each node's 3 non-representatives
    # form one group, the 4 representatives two crossing pairs (6 groups, 2 crossing); any
    # other division: two pairs per node (8 groups, none crossing).
    expected = 2 / (6 + 8 * (cross_node_every - 1))
    assert crossing / len(groups) == pytest.approx(expected, rel=0.05)


def test_a_restored_generator_draws_what_the_original_would_draw_next():
    """Under "all" a division is a shuffle of every worker: after a snapshot, a generator
    restored from it hands out the same groups as the original going on, while a fresh one
    with the same seed starts the sequence over."""
    from ripples.schedule.generator_checkpoint import generator_state, restore_generator_state

    def run(gen, rounds):
        out = []
        for _ in range(rounds):
            for worker in range(6):
                gen.request(worker)
                out += gen.poll()[worker]
        return out

    original = GroupGenerator(6, 2, seed=3, policy="all")
    first = run(original, 4)
    state = generator_state(original)
    restored = GroupGenerator(6, 2, seed=3, policy="all")
    restore_generator_state(restored, state)
    assert run(restored, 4) == run(original, 4)
    assert run(GroupGenerator(6, 2, seed=3, policy="all"), 4) == first
    assert first != run(GroupGenerator(6, 2, seed=3, policy="all"), 8)[24:]  # not periodic


def test_an_older_state_never_takes_the_sequence_numbers_back():
    """A state saved before the groups a running generator already handed out (a rank 0
    reloading an earlier checkpoint) must not make a rank see a sequence number again."""
    from ripples.schedule.generator_checkpoint import generator_state, restore_generator_state
    gen = GroupGenerator(2, 2, seed=0, policy="all")
    early = generator_state(gen)
    seqs = []
    for _ in range(3):
        gen.request(0)
        seqs += [seq for seq, _ in gen.poll()[0]]
    restore_generator_state(gen, early)
    gen.request(0)
    later = [seq for seq, _ in gen.poll()[0]]
    assert seqs == [0, 1, 2] and later == [3], (seqs, later)


def test_a_restored_generator_knows_the_speeds_and_refuses_another_size():
    from ripples.schedule.generator_checkpoint import generator_state, restore_generator_state
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="all", clock=lambda: now[0])
    interval = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.4}  # worker 3 asks 4x less often
    for step in range(3):
        for worker in range(4):
            now[0] = step * interval[worker]
            gen.request(worker)
            gen.poll()
    fresh = GroupGenerator(4, 2, seed=0, policy="all")
    assert fresh.speed_estimate(3) is None
    restore_generator_state(fresh, generator_state(gen))
    assert [fresh.speed_estimate(w) for w in range(4)] == pytest.approx([0.1, 0.1, 0.1, 0.4])
    with pytest.raises(ValueError, match="checkpoint is of 4 workers, this generator has 5"):
        restore_generator_state(GroupGenerator(5, 2, seed=0), generator_state(gen))


def test_every_division_counts_why_it_ran_and_how_many_ready_workers_it_divided():
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="ready", first_wait_s=0.2, clock=lambda: now[0])
    for w in range(4):
        gen.request(w)
    assert sorted(gen.poll()) == [0, 1, 2, 3]  # nobody else to wait for
    now[0] = 1.0  # every worker asks again: each one's interval is now known (1 s)
    for w in range(4):
        gen.request(w)
    gen.poll()
    now[0] = 1.1  # worker 0 alone; the others are expected at 2.0, after its window (1.2)
    gen.request(0)
    assert list(gen.poll()) == [0]
    assert gen.division_reasons == {"everyone ready": 2, "nobody expected sooner": 1}
    assert gen.divided_by_reason == {"everyone ready": 8, "nobody expected sooner": 1}

    lone = GroupGenerator(4, 2, seed=0, policy="ready", first_wait_s=0.2,
                          clock=lambda: now[0])
    now[0] = 0.0
    lone.request(3)  # the others' speed is unknown: they may come at any moment
    assert lone.poll() == {}
    now[0] = 0.25
    assert list(lone.poll()) == [3]
    assert lone.division_reasons == {"window ended": 1}

    every = GroupGenerator(4, 2, seed=0, policy="all", clock=lambda: now[0])
    every.request(1)
    every.poll()
    assert every.division_reasons == {"all": 1} and every.divided_by_reason == {"all": 1}


def test_events_record_every_request_and_the_groups_each_division_made():
    now = [0.0]
    gen = GroupGenerator(4, 2, seed=0, policy="ready", first_wait_s=0.2, clock=lambda: now[0])
    for w in (2, 0):
        now[0] += 0.01
        gen.request(w)
    now[0] = 0.3  # their windows ended; 1 and 3 have not asked
    answers = gen.poll()
    assert list(gen.events) == [("request", 0.01, 2), ("request", 0.02, 0),
                                ("division", 0.3, "window ended", [(0, 2)])]
    assert {w: [group for _, group in got] for w, got in answers.items()} == {0: [(0, 2)],
                                                                              2: [(0, 2)]}


def test_events_keep_only_the_latest():
    from ripples.schedule.generator import EVENTS_KEPT

    now = [0.0]
    gen = GroupGenerator(2, 2, seed=0, policy="ready", clock=lambda: now[0])
    for step in range(EVENTS_KEPT):
        now[0] = float(step)
        for w in (0, 1):
            gen.request(w)
        gen.poll()
    assert len(gen.events) == EVENTS_KEPT
    assert gen.events[-1] == ("division", EVENTS_KEPT - 1.0, "everyone ready", [(0, 1)])
    # 3 events a step, the latest EVENTS_KEPT of 3 * EVENTS_KEPT kept: the first kept one
    # is event 2 * EVENTS_KEPT, of step (2 * EVENTS_KEPT) // 3
    first = 2 * EVENTS_KEPT
    assert gen.events[0][:2] == (("request", "request", "division")[first % 3], first // 3)
