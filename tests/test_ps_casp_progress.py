"""CASP's progress controller (communities="progress"), pure logic: which counts it tries,
how it measures loss decrease per second, how it corrects for the loss falling slower
later in training, and what it commits to when driven through casp.observe/regroup."""
import pytest

from ripples.ps import casp, casp_progress as cp

CLASSES = [1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]


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
    # ASP's rate falls from 10 (t=1) to 6 (t=5): the reference at t=2 is 9, at t=4 is 7.
    results = [(8, 1.0, 10.0), (2, 2.0, 9.5), (1, 4.0, 8.0), (8, 5.0, 6.0)]
    # 2: 9.5 / 9 = 1.06 (under the 10% margin); 1: 8 / 7 = 1.14
    assert cp.decide(results, 8) == 1
    assert cp.decide(results, 8, margin=0.2) == 8
    # Against the raw rates BSP (8.0) would lose to ASP's first window (10.0).
    assert cp.decide([(8, 1.0, 10.0), (2, 2.0, 8.9), (8, 3.0, 8.0)], 8) == 8
    assert cp.decide([(8, 1.0, 10.0), (2, 2.0, None), (8, 3.0, None)], 8) == 8


def drive(rate_of_count, times, losses=True, seconds=60.0, regroup_every=3, overhead=0.0,
          half_life=20.0):
    """Pushes of every community at its slowest member's pace plus ``overhead`` (waiting
    for the servers), in server seconds; the loss
    falls at ``rate_of_count[count]`` per second times a decay that halves every
    ``half_life`` seconds.
    Returns the controller after ``seconds``."""
    n = len(times)
    state = casp.Controller(n, casp.PROGRESS, regroup_every)
    now, loss, due = 0.0, 10.0, {}
    while now < seconds:
        plan, version = state.plan, state.version
        due = {c: due.get(c, 0.0) for c in plan}
        members = min(plan, key=lambda c: (due[c], c))
        step = due[members] - now
        now = due[members]
        loss -= step * rate_of_count[len(plan)] * 0.5 ** (now / half_life)
        casp.observe(state, version, members, {w: times[w] for w in members},
                     [loss] * len(members) if losses else (), now)
        casp.regroup(state)
        due = {c: now + max(times[w] for w in c) + overhead if c == members
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


def test_windows_end_by_time_once_every_community_pushed_under_the_plan():
    # Rounds take compute + 3 s: 10 rounds of the slow community are 60 s, but a window
    # ends once it spans 10 x 3 s of compute (and every community pushed once): three
    # windows fit in 120 s only when cut by time.
    assert cp.window_due(cp.Progress(8, window=[(0.0, 1.0), (30.0, 0.5)]), CLASSES, 10)
    assert not cp.window_due(cp.Progress(8, window=[(0.0, 1.0), (29.0, 0.5)]), CLASSES, 10)
    state = drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES, seconds=120.0, regroup_every=10,
                  overhead=3.0, half_life=200.0)
    assert state.progress.committed == 2
    assert all(c in (8, 2) for c, _, _ in state.progress.results)


def test_without_reported_losses_it_stays_asp():
    state = drive({8: 1.0, 2: 1.5, 1: 0.5}, CLASSES, losses=False)
    assert state.progress.committed == 8 and state.version == 0


def test_asp_starved_by_its_servers_commits_to_communities_after_one_window():
    # 8 workers at 1 s per batch could deliver 8 batches/s; the servers took 2 per second.
    busy = [(t / 2, 10.0 - t / 2) for t in range(12)]
    assert cp.starved(busy, [1.0] * 8)
    assert not cp.starved([(t / 8, 10.0) for t in range(12)], [1.0] * 8)
    assert not cp.starved([(t / 3, 10.0) for t in range(12)], [1.0] * 8)  # 3 of 8: not yet
    state = cp.Progress(8, window=busy)
    assert cp.boundary(state, [1.0] * 8) == 2 and state.committed == 2
    # a server that keeps up: the exploration goes on with the next arm
    state = cp.Progress(8, window=[(t / 8, 10.0 - t / 8) for t in range(12)])
    assert cp.boundary(state, [1.0] * 8) == 2 and state.committed is None


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

    run = ParameterServerRun(scenario("ps-casp", communities="progress", regroup_every=3),
                             None)
    progress = run.run()
    asp = simulate(scenario("ps-asp"))
    assert run.controller.progress.committed < 8 and len(run.controller.plan) < 8
    assert progress.time_to_target_s < 0.85 * asp.time_to_target_s
