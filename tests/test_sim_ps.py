"""The simulator's parameter-server modes: the servers' links, the policies' gates and
scales (the real ripples.ps logic), and CASP's communities, against outcomes that follow
from first principles."""
import dataclasses

import pytest

from ripples.sim import Compute, Link, Network, Problem, Scenario, Speed, simulate
from ripples.sim.cli import main as cli_main
from ripples.sim.ps import ParameterServerRun
from ripples.sim.ps_eager import EagerRun
from ripples.sim.ps_tasks import TaskRun

SMALL = Problem(dim=8, train_samples=2048, test_samples=512, lr=0.05, margin=10.0)
FREE = Network(workers_per_node=1, inter=Link(0.0, 1e15))  # no communication cost


def scenario(mode, workers=8, speed=Speed(), horizon=20.0, network=FREE, model_bytes=0.0,
             **knobs):
    return Scenario(mode, workers, Compute(0.1), speed, network, model_bytes=model_bytes,
                    problem=SMALL, horizon_s=horizon, group_size=min(2, workers), **knobs)


def test_bsp_round_time_on_one_server_link_follows_from_the_queue():
    # 4 workers, 0.1 s steps, a push or pull takes 0.05 s on the server's link, one at a
    # time: round 1 closes at 0.1 + 4 x 0.05 = 0.3; pulls end at 0.35 .. 0.5 and the next
    # pushes queue behind each other, so every later round closes 0.35 s after the last.
    # By 7.2 s: rounds closing at 0.3 + 0.35 k <= 7.2, k = 0..19.
    net = Network(workers_per_node=1, inter=Link(0.0, 1e9))
    result = simulate(scenario("ps-bsp", 4, horizon=7.2, network=net, model_bytes=5e7))
    assert result.groups == 20
    assert result.mean_group_size == 4
    assert all(s in (20, 21) for s in result.steps)
    two = simulate(scenario("ps-bsp", 4, horizon=7.2, network=net, model_bytes=5e7,
                            ps_servers=2))
    assert two.groups > 24  # half the bytes per server link


def test_one_asp_worker_steps_compute_push_pull():
    net = Network(workers_per_node=1, inter=Link(0.0, 1e9))
    result = simulate(scenario("ps-asp", 1, horizon=10.0, network=net, model_bytes=5e7))
    assert result.steps == [50]  # 0.1 + 0.05 + 0.05 per step
    # a second server halves each server's shard, not the worker's own link
    two = simulate(scenario("ps-asp", 1, horizon=10.0, network=net, model_bytes=5e7,
                            ps_servers=2))
    assert two.steps == [50]


def test_a_slow_worker_holds_back_bsp_and_ssp_within_their_bounds_but_not_asp():
    slow = Speed("stragglers", count=1, factor=5.0)
    bsp = simulate(scenario("ps-bsp", speed=slow))
    assert max(bsp.steps) - min(bsp.steps) <= 1
    assert bsp.steps_per_s == pytest.approx(8 / 0.5, rel=0.05)
    for staleness in (0, 3):
        ssp = simulate(scenario("ps-ssp", speed=slow, staleness=staleness))
        assert max(ssp.steps) - min(ssp.steps) <= staleness + 1
    asp = simulate(scenario("ps-asp", speed=slow))
    assert asp.fraction_of_ceiling >= 0.98
    assert asp.groups == sum(asp.steps)  # every push applied on arrival
    assert asp.steps[7] < asp.steps[0] / 4


def test_syncopt_closes_rounds_without_the_slow_worker_and_drops_its_pushes():
    slow = Speed("stragglers", count=1, factor=5.0)
    run = ParameterServerRun(scenario("ps-syncopt", speed=slow, backup_workers=1), None)
    result = run.run()
    assert result.mean_group_size == 7  # the first N = 8 - 1 pushes of each round
    assert run.dropped >= result.steps[7] - 2  # nearly every slow push came too late
    assert result.fraction_of_ceiling > 0.9


def test_bsp_applies_the_same_update_as_allreduce():
    """With no communication cost BSP's server applies the mean of the workers' gradients
    at the same parameters, as all-reduce does: same throughput, and the loss curves of
    the two differ only by the draw of the mini-batches."""
    bsp, allreduce = (simulate(scenario(m, horizon=10.0)) for m in ("ps-bsp", "allreduce"))
    assert bsp.steps == allreduce.steps
    assert bsp.final_loss == pytest.approx(allreduce.final_loss, rel=0.02)
    asp = simulate(scenario("ps-asp", horizon=10.0, push_lr_scale=1.0))
    assert asp.final_loss != pytest.approx(bsp.final_loss, rel=0.02)  # the test can tell


def test_casp_one_community_is_bsp_and_one_each_is_asp():
    slow = Speed("stragglers", count=1, factor=5.0)
    one = simulate(scenario("ps-casp", speed=slow, communities=1))
    bsp = simulate(scenario("ps-bsp", speed=slow))
    assert one.steps == bsp.steps and one.groups == bsp.groups
    each = simulate(scenario("ps-casp", speed=slow, communities=8))
    asp = simulate(scenario("ps-asp", speed=slow))
    assert each.steps == asp.steps and each.groups == asp.groups


def test_casp_controller_separates_the_slow_worker():
    slow = Speed("stragglers", count=1, factor=5.0)
    run = ParameterServerRun(scenario("ps-casp", speed=slow, regroup_every=5, horizon=30.0),
                             None)
    result = run.run()
    plan = run.controller.plan
    assert (7,) in plan and len(run.controller.history) >= 2
    # after the regroup the fast community no longer waits for worker 7
    assert result.steps[0] > 0.8 * 30 / 0.1
    assert sorted(w for c in plan for w in c) == list(range(8))


def test_task_modes_with_equal_speeds_apply_the_rounds_of_bsp():
    """A clock's 32 micro-batches of 8 samples are the 8 workers' batches of 32 cut
    finer: drawn from the same stream at the same parameters, the servers apply the same
    mean gradient each round as BSP, up to the order of the sums."""
    bsp = simulate(scenario("ps-bsp", horizon=10.05))  # rounds end at 0.1 k
    for mode in ("ps-epsp", "ps-flexrr"):
        tasks = simulate(scenario(mode, horizon=10.05))
        assert tasks.groups == bsp.groups and tasks.mean_group_size == 32  # tasks per round
        # plus the tasks of the clock in progress at the horizon (a task is 1/4 step)
        assert 0 <= sum(tasks.steps) - sum(bsp.steps) < 8
        assert tasks.final_loss == pytest.approx(bsp.final_loss, rel=1e-9)
    finer = simulate(scenario("ps-epsp", horizon=10.05, tasks_per_clock=64))
    assert finer.final_loss == pytest.approx(bsp.final_loss, rel=1e-9)


def test_epsp_rebalances_shares_and_flexrr_moves_tasks_off_a_slow_worker():
    """8 workers, worker 7 5x slow, 32 tasks of 0.025 s (0.125 s on worker 7); ceiling
    7 / 0.1 + 1 / 0.5 = 72 steps/s. EPSP's balanced shares (1 task for worker 7, 4-5 for
    the others) take 0.125 s per clock of 8 steps: 64 steps/s. FlexRR-lite keeps 4 tasks
    each; the pioneers take worker 7's tasks while it has more than one unclaimed, so it
    computes 2: 0.25 s per clock, 32 steps/s. BSP: 0.5 s per round, 16 steps/s."""
    slow = Speed("stragglers", count=1, factor=5.0)
    epsp = TaskRun(scenario("ps-epsp", speed=slow), None)
    result = epsp.run()
    assert epsp.board.shares[7] == 1 and epsp.board.stats["rebalances"] >= 3
    assert result.steps_per_s == pytest.approx(64, rel=0.05)
    flexrr = TaskRun(scenario("ps-flexrr", speed=slow), None)
    result = flexrr.run()
    assert flexrr.board.shares == [4] * 8  # never rebalanced
    assert flexrr.board.stats["transfers"] == pytest.approx(2 * flexrr.applied, abs=2)
    assert result.steps_per_s == pytest.approx(32, rel=0.05)
    bsp = simulate(scenario("ps-bsp", speed=slow))
    assert bsp.steps_per_s == pytest.approx(16, rel=0.05)


@pytest.mark.parametrize("mode", ["ps-epsp", "ps-flexrr"])
def test_task_modes_apply_every_task_once_within_the_staleness_bound(mode):
    jittery = Speed("random", probability=0.3, factor=4.0)
    net = Network(workers_per_node=1, inter=Link(1e-3, 1e9))
    run = TaskRun(scenario(mode, speed=jittery, staleness=1, network=net, model_bytes=1e6),
                  None)
    spread = []
    run.answer_pulls = (lambda inner: lambda: (spread.append(max(run.clock_of) - run.applied),
                                               inner()))(run.answer_pulls)
    result = run.run()
    assert run.applied > 50 and run.board.stats["transfers"] > 0
    for clock in range(run.applied):  # complete() refuses a second completion of a task
        assert run.board.clocks[clock].done == set(range(32))
    assert max(spread) <= 1 + 1  # a worker starts clock c + 1 once round c - 1 is applied
    assert sum(result.steps) >= run.applied * 8  # every applied task was computed


def test_eager_computes_one_push_behind_and_scales_by_the_staleness_it_expects():
    """One worker, free links: its first push expects staleness 1; every later one is
    computed on the parameters before its previous push (pulls are decoupled), so it expects
    2 and pushes at half the learning rate."""
    run = EagerRun(scenario("ps-eager", 1, horizon=1.05), None)
    result = run.run()
    assert result.steps == [10] and run.factors == [1.0] + [0.5] * 9


def test_eager_hides_the_pull_behind_the_next_step():
    """One worker, 0.1 s steps, a push or a pull takes 0.15 s. ASP: 0.1 + 0.15 + 0.15 s
    per step, 25 steps in 10 s. Eager waits only for the pull asked a step earlier, which
    leaves when its push lands: steps start 0.15 and 0.25 s apart in turn, 50 in 10 s."""
    net = Network(workers_per_node=1, inter=Link(0.0, 1e9))
    eager, asp = (simulate(scenario(m, 1, horizon=10.0, network=net, model_bytes=1.5e8))
                  for m in ("ps-eager", "ps-asp"))
    assert asp.steps == [25] and eager.steps == [50]


def test_ps_knobs_are_checked():
    with pytest.raises(ValueError, match="staleness"):
        scenario("ps-ssp")
    with pytest.raises(ValueError, match="communities"):
        scenario("ps-casp", communities=9)
    with pytest.raises(ValueError, match="ps_servers"):
        scenario("ps-bsp", ps_servers=0)
    with pytest.raises(SystemExit):
        cli_main(["--modes", "ps-ssp", "--workers", "4", "--quiet"])


def test_cli_runs_ps_modes(capsys):
    assert cli_main(["--workers", "4", "--modes", "ps-bsp,ps-asp,ps-casp", "--step-ms", "10",
                     "--model-mb", "1", "--target-steps", "20", "--horizon-s", "5",
                     "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ps-bsp" in out and "ps-casp" in out


def test_replace_keeps_knobs():
    base = scenario("allreduce", staleness=2)
    assert dataclasses.replace(base, mode="ps-ssp").policy_spec().staleness == 2
