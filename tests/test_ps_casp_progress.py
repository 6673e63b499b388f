"""CASP's measuring controller (communities="auto"), pure logic: which counts it tries,
how it measures batches and loss decrease per second, how it corrects for the loss falling slower
later in training, and what it commits to when driven through casp.observe/regroup."""
import pytest

from ripples.ps import casp, casp_progress as cp

CLASSES = [1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]


def test_the_communities_option_selects_the_controller_and_the_push_weights():
    # "auto" (and its older name) measure and weigh pushes by size; the others push means
    assert casp.controller_count("auto") == casp.controller_count("progress") == casp.PROGRESS
    assert casp.weighs_by_size("auto") and casp.weighs_by_size("progress")
    assert casp.controller_count("projected") is None and not casp.weighs_by_size("projected")
    assert casp.controller_count(3) == 3 and not casp.weighs_by_size(3)
    assert casp.controller_count("learned") == casp.LEARNED
    assert len(casp.Controller(8, casp.controller_count("auto"), 5).plan) == 8  # ASP first
    assert len(casp.Controller(8, casp.controller_count("projected"), 5).plan) == 1


def test_arms_start_and_end_at_asp_and_skip_counts_that_halve_throughput():
    assert cp.arms([1.0] * 8) == [8, 2, 1, 8]  # equal speeds: BSP loses nothing
    # workers 4-7 3x slower: BSP's 8/3 batches per time is half of ASP's 4 + 4/3
    assert cp.arms(CLASSES) == [8, 2, 8]
    assert cp.arms([1.0] * 7 + [1.5]) == [8, 2, 1, 8]  # BSP at 8/1.5 = 0.70x ASP's 7.67
    assert cp.arms([1.0, 3.0]) == [2, 1, 2] or cp.arms([1.0, 3.0]) == [2]
    assert cp.arms([2.0]) == [1]


def test_slope_rate_is_the_least_squares_decrease_per_second():
    samples = [(t / 10, 5.0 - 2.0 * t / 10) for t in range(10)]
    assert cp.slope_rate(samples) == pytest.approx(2.0)
    noisy = [(0.0, 1.0), (0.0, 3.0), (1.0, 0.0), (1.0, 2.0)]  # means 2 -> 1 over 1 s
    assert cp.slope_rate(noisy) == pytest.approx(1.0)
    assert cp.slope_rate(samples[:3]) is None
    assert cp.slope_rate([(1.0, 2.0)] * 5) is None


def test_decide_compares_each_arm_with_asp_interpolated_to_its_window():
    W = cp.Window
    # Equal batch rates. ASP's loss rate falls from 10 (t=1) to 6 (t=5): the reference
    # at t=2 is 9, at t=4 is 7.
    results = [W(8, 1.0, 10.0, 50.0), W(2, 2.0, 9.5, 50.0), W(1, 4.0, 8.0, 50.0),
               W(8, 5.0, 6.0, 50.0)]
    # 2: 9.5 / 9 = 1.06 (under the 10% margin); 1: 8 / 7 = 1.14
    assert cp.decide(results, 8) == 1
    assert cp.decide(results, 8, margin=0.2) == 8
    # Against the raw rates BSP (8.0) would lose to ASP's first window (10.0).
    assert cp.decide([W(8, 1.0, 10.0, 50.0), W(2, 2.0, 8.9, 50.0), W(8, 3.0, 8.0, 50.0)],
                     8) == 8
    # An arm more than the margin behind ASP in batches loses, whatever its loss rate.
    assert cp.decide([W(8, 1.0, 10.0, 50.0), W(2, 2.0, 30.0, 44.0), W(8, 3.0, 10.0, 50.0)],
                     8) == 8
    assert cp.decide([W(8, 1.0, 10.0, 50.0), W(2, 2.0, 30.0, 46.0), W(8, 3.0, 10.0, 50.0)],
                     8) == 2
    # No losses: batches per second decide, by more than the margin.
    assert cp.decide([W(8, 1.0, None, 50.0), W(2, 2.0, None, 56.0)], 8) == 2
    assert cp.decide([W(8, 1.0, None, 50.0), W(2, 2.0, None, 54.0)], 8) == 8


def drive(rate_of_count, times, losses=True, seconds=60.0, regroup_every=3, overhead=0.0,
          half_life=20.0, collective_s=0.0, server_s=0.0):
    """Pushes of every community at its slowest member's pace plus ``overhead`` (waiting
    for the servers) plus ``collective_s`` for a community of more than one member (its
    P-Reduce), in server seconds; one server takes pushes one at a time, ``server_s``
    each. The loss falls at ``rate_of_count[count]`` per second times a decay that halves
    every ``half_life`` seconds. Returns the controller after ``seconds``."""
    n = len(times)
    state = casp.Controller(n, casp.controller_count("auto"), regroup_every)
    now, loss, due, server_free = 0.0, 10.0, {}, 0.0
    while now < seconds:
        plan, version = state.plan, state.version
        due = {c: due.get(c, 0.0) for c in plan}
        members = min(plan, key=lambda c: (due[c], c))
        arrived = max(due[members], server_free) + server_s
        server_free = arrived
        loss -= (arrived - now) * rate_of_count[len(plan)] * 0.5 ** (arrived / half_life)
        now = arrived
        casp.observe(state, version, members, {w: times[w] for w in members},
                     [loss] * len(members) if losses else (), now)
        casp.regroup(state)
        cost = collective_s if len(members) > 1 else 0.0
        due = {c: now + max(times[w] for w in c) + overhead + cost if c == members
               else due.get(c, now)
               for c in state.plan}
    return state


def test_starts_as_asp_and_commits_to_the_count_whose_loss_falls_fastest():
    two_wins = drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES)
    assert two_wins.progress.committed == 2
    assert [len(plan) for _, plan in two_wins.history[:3]] == [8, 2, 8]
    assert len(two_wins.plan) == 2 and set(two_wins.plan) == {(0, 1, 2, 3), (4, 5, 6, 7)}
    asp_wins = drive({8: 1.0, 2: 0.9, 1: 0.5}, CLASSES)
    assert asp_wins.progress.committed == 8 and len(asp_wins.plan) == 8
    bsp_wins = drive({8: 1.0, 2: 0.9, 1: 1.6}, [1.0] * 8)
    assert bsp_wins.progress.committed == 1 and len(bsp_wins.plan) == 1


def test_an_arm_behind_asp_in_batches_loses_after_a_short_trial_whatever_its_loss():
    # Each community's P-Reduce costs 0.5 s: two communities make 4/1.5 + 4/3.5 = 3.8
    # batches/s against ASP's 5.3 (0.71x); their loss would fall 1.5x as fast.
    state = drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES, regroup_every=10, collective_s=0.5,
                  seconds=120.0)
    assert state.progress.committed == 8 and len(state.plan) == 8
    asp, trial = state.progress.results
    assert [asp.count, trial.count] == [8, 2]  # no closing ASP window was needed
    assert trial.batch_rate < 0.9 * asp.batch_rate
    # The trial ended after TRIAL_ROUNDS of the slowest compute time (3 x 3 s, plus the
    # round in flight), not after regroup_every of them (30 s): ASP's window spans about
    # 0-27 s, so the trial's middle is about 32 s (a full window's would be about 42 s).
    assert len(state.history) == 3  # ASP, two communities, ASP again
    assert trial.middle - asp.middle < 22.0


def test_windows_end_by_time_once_every_community_pushed_under_the_plan():
    # Rounds take compute + 3 s: 10 rounds of the slow community are 60 s, but a window
    # ends once it spans 10 x 3 s of compute (and every community pushed once): three
    # windows fit in 120 s only when cut by time.
    assert cp.window_due(cp.Progress(8, pushes=[(0.0, (0,), 1), (30.0, (0,), 1)]), CLASSES, 10)
    assert not cp.window_due(cp.Progress(8, pushes=[(0.0, (0,), 1), (29.0, (0,), 1)]), CLASSES, 10)
    state = drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES, seconds=120.0, regroup_every=10,
                  overhead=3.0, half_life=200.0)
    assert state.progress.committed == 2
    assert all(r.count in (8, 2) for r in state.progress.results)


def test_without_reported_losses_batches_per_second_decide():
    # Every count completes the same batches per second: ASP stays.
    state = drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES, losses=False)
    assert state.progress.committed == 8 and len(state.plan) == 8
    # A server that takes 0.2 s a push caps ASP at 5 pushes (batches) per second, under
    # the 8 its workers could compute; two communities push 4 batches at a time, one
    # community (BSP) 8 (the server's 0.2 s then holds up every round: 8 / 1.2 s).
    state = drive({8: 1.0, 2: 1.0, 1: 1.0}, [1.0] * 8, losses=False, server_s=0.2)
    rates = {r.count: r.batch_rate for r in state.progress.results}
    assert all(r.loss_rate is None for r in state.progress.results)
    assert rates[8] == pytest.approx(5.0, rel=0.05) and rates[1] == pytest.approx(8 / 1.2)
    assert rates[2] < rates[1]
    assert state.progress.committed == 1 and len(state.plan) == 1


def test_asp_starved_by_its_servers_commits_to_communities_after_one_window():
    # 8 workers at 1 s per batch could deliver 8 batches/s; the servers took 2 per second.
    def pushes(per_s):  # one worker's push at a time, in turn
        return [(t / per_s, (t % 8,), 1) for t in range(24)]

    busy = pushes(2)
    assert cp.starved(busy, [1.0] * 8)
    assert not cp.starved(pushes(8), [1.0] * 8)
    assert not cp.starved(pushes(3), [1.0] * 8)  # 3 of 8: not yet
    state = cp.Progress(8, pushes=busy)
    assert cp.boundary(state, [1.0] * 8) == 2 and state.committed == 2
    # a server that keeps up: the exploration goes on with the next arm
    state = cp.Progress(8, pushes=pushes(8))
    assert cp.boundary(state, [1.0] * 8) == 2 and state.committed is None


def test_asp_starved_before_every_worker_pushed_leaves_for_one_community_at_once():
    # 32 workers at 1 s per batch could deliver 32 batches/s; the server takes 2 a second,
    # so every worker's first push would take 16 s to arrive.
    def pushes(count, per_s):
        return [(t / per_s, (t,), 1) for t in range(count)]

    known = [1.0] * 7
    assert cp.starved_before_every_push(cp.Progress(32, pushes=pushes(7, 2)), known)
    assert not cp.starved_before_every_push(cp.Progress(32, pushes=pushes(5, 2)), known[:5])
    assert not cp.starved_before_every_push(cp.Progress(32, pushes=pushes(31, 10)), [1.0] * 31)
    assert not cp.starved_before_every_push(cp.Progress(32, pushes=pushes(7, 2), schedule=[32]),
                                            known)
    # Within 5 s (not the 16 s of every first push): one community, whose round brings
    # every compute time, then the projection's count, with no window measured.
    state = drive({32: 1.0, 2: 1.0, 1: 1.0}, [1.0] * 32, losses=False, server_s=0.5,
                  seconds=5.0)
    assert state.progress.starved_early
    assert [len(plan) for _, plan in state.history] == [32, 1, 2]
    assert state.progress.committed == 2 and not state.progress.results
    # a server that keeps up: every worker pushes first, the exploration is unchanged
    assert not drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES).progress.starved_early


def test_in_the_simulator_a_busy_server_makes_it_leave_asp():
    """8 workers (4 of them 3x slower) push a 50 MB model through one 1 GB/s link (50 ms
    per push): under ASP the link is the bottleneck, the loss falls faster under two
    communities, and the controller, judging by the loss alone, commits to them and
    reaches the target loss well before ASP does (0.75x in this deterministic run)."""
    from ripples.sim import Compute, Link, Network, Problem, Scenario, Speed, simulate
    from ripples.sim.ps import ParameterServerRun

    def scenario(mode, **knobs):
        return Scenario(mode, 8, Compute(0.1), Speed("stragglers", count=4, factor=3.0),
                        Network(workers_per_node=8, inter=Link(0.0, 1e9)),
                        model_bytes=5e7, problem=Problem(dim=8, train_samples=2048,
                                                         test_samples=512, margin=10.0),
                        horizon_s=60.0, stop_at_target=True, target_loss=0.3,
                        target_on="average", **knobs)

    run = ParameterServerRun(scenario("ps-casp", communities="auto", regroup_every=3),
                             None)
    progress = run.run()
    asp = simulate(scenario("ps-asp"))
    assert run.controller.progress.committed < 8 and len(run.controller.plan) < 8
    assert progress.time_to_target_s < 0.85 * asp.time_to_target_s
