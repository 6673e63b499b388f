"""The simulator's parts: speed and compute models, network costs, the statistical model,
and the engine against cases whose outcome follows from first principles."""
import dataclasses
import math

import numpy as np
import pytest

from ripples.schedule import adpsgd_pairs, static_partition
from ripples.sim import (Compute, Link, Network, Problem, Scenario, Speed, simulate,
                         target_loss)
from ripples.sim.cli import build_parser, main as cli_main, scenario_from_args
from ripples.sim.loop import EventLoop
from ripples.sim.sources import PerStep
from ripples.sim.stats import Workers, allreduce_loss_curve

SMALL = Problem(dim=8, train_samples=2048, test_samples=512, lr=0.05, margin=10.0)


def test_compute_from_step_time_or_flops():
    assert Compute(step_s=0.05).seconds == 0.05
    assert Compute(flops_per_step=4e11, device_flops=4e12).seconds == pytest.approx(0.1)
    with pytest.raises(ValueError, match="step_s, or flops_per_step"):
        Compute()
    with pytest.raises(ValueError, match="update_s must be >= 0"):
        Compute(step_s=0.05, update_s=-1.0)


def test_a_slowdown_stretches_the_compute_and_not_the_update():
    # One worker 5x slow: its compute takes 5 * 40 ms, the update 10 ms more, unstretched.
    base = Scenario("static", 2, Compute(step_s=0.04, update_s=0.01),
                    Speed("stragglers", count=1, factor=5.0), Network(workers_per_node=1),
                    problem=SMALL, group_size=2)
    assert base.ceiling_steps_per_s() == pytest.approx(1 / 0.05 + 1 / 0.21)
    loop = EventLoop(base, None)
    started = []
    loop.push = lambda at, kind, w: started.append((w, at))
    loop.start_compute(0)
    loop.start_compute(1)
    assert started == [(0, pytest.approx(0.05)), (1, pytest.approx(0.21))]
    assert loop.last_compute == [pytest.approx(0.04), pytest.approx(0.2)]  # overlappable


def test_speed_models():
    s = Speed("stragglers", count=2, factor=5.0).sampler(6, seed=0)
    assert [s.factor(w) for w in range(6)] == [1, 1, 1, 1, 5, 5]
    r = Speed("random", probability=0.25, factor=3.0).sampler(1, seed=0)
    draws = [r.factor(0) for _ in range(20000)]
    assert set(draws) == {1.0, 3.0}
    assert np.mean(np.array(draws) == 3.0) == pytest.approx(0.25, abs=0.02)
    assert r.expected[0] == pytest.approx(1.5)
    logn = Speed("lognormal", sigma=0.5).expected_factors(1000, seed=1)
    assert np.median(np.log(logn)) == pytest.approx(0.0, abs=0.1) and logn.min() >= 0.1
    with pytest.raises(ValueError, match="speed kind"):
        Speed("bogus")


def test_ring_and_tree_costs_and_contention():
    net = Network(workers_per_node=4, intra=Link(1e-6, 100e9), inter=Link(10e-6, 1e9))
    # one node: intra link, 2(g-1) steps of b/g bytes
    assert net.allreduce_s(4e6, 4, 1) == pytest.approx(6 * (1e-6 + 1e6 / 100e9))
    # two nodes, two collectives sharing a NIC: half the bandwidth
    one = net.allreduce_s(8e6, 8, 2)
    assert one == pytest.approx(14 * (10e-6 + 1e6 / 1e9))
    assert net.allreduce_s(8e6, 8, 2, sharing=2) == pytest.approx(14 * (10e-6 + 2e6 / 1e9))
    tree = dataclasses.replace(net, algorithm="tree")
    assert tree.allreduce_s(8e6, 8, 2) == pytest.approx(6 * 10e-6 + 16e6 / 1e9)
    assert net.allreduce_s(1e9, 1, 1) == 0.0
    assert net.nodes((0, 3, 4, 9)) == {0, 1, 2}


def test_a_pair_across_nodes_takes_its_own_bandwidth_and_nothing_else_does():
    net = Network(workers_per_node=2, intra=Link(1e-6, 100e9), inter=Link(10e-6, 1e9),
                  inter_pair_Bps=4e9)
    # a pair on two nodes: ring of 2 = 2 steps of b/2 at the pair's bandwidth
    assert net.allreduce_s(8e6, 2, 2) == pytest.approx(2 * (10e-6 + 4e6 / 4e9))
    assert net.allreduce_s(8e6, 2, 2, sharing=2) == pytest.approx(2 * (10e-6 + 8e6 / 4e9))
    # a pair on one node and larger groups across nodes keep their links
    assert net.allreduce_s(8e6, 2, 1) == pytest.approx(2 * (1e-6 + 4e6 / 100e9))
    assert net.allreduce_s(8e6, 4, 2) == pytest.approx(6 * (10e-6 + 2e6 / 1e9))
    with pytest.raises(ValueError, match="inter_pair_Bps"):
        Network(inter_pair_Bps=0.0)


class _Collectives(EventLoop):
    """Collectives started at given times, and when each ended (no workers compute)."""

    def __init__(self, sharing, starts):
        net = Network(workers_per_node=1, inter=Link(0.0, 1e9), link_sharing=sharing)
        super().__init__(Scenario("static", 4, Compute(1.0), network=net, problem=SMALL,
                                  horizon_s=10.0), None)
        self.starts, self.ended = starts, {}

    def start(self):
        for at, members, parts, name in self.starts:
            self.push(at, "begin", members, parts, name)
        self.push(11.0, "computed", 0)  # past the horizon: the run ends there

    def handlers(self):
        return {"computed": None, "begin": self.start_collective, "end": self.end}

    def start_collective(self, members, parts, name):
        super().start_collective(members, parts, "end", name)

    def end(self, name):
        self.ended[name] = self.clock.now

    def measure(self):
        return 0.0, 0.0, 0.0


def _ends(sharing, *starts):
    loop = _Collectives(sharing, starts)
    loop.run()
    return loop.ended


def test_fixed_shares_hold_for_the_whole_collective_fair_ones_follow_the_others():
    # (start, members, (fixed_s, wire_s)): one node per worker, so (0, 1) crosses two NICs
    together = [(0.0, (0, 1), (0.1, 1.0), "a"), (0.0, (0, 1), (0.1, 1.0), "b")]
    # fixed: the first found the links free, the second shares them with it throughout
    assert _ends("fixed", *together) == pytest.approx({"a": 1.1, "b": 2.1})
    # fair: both at half the pace until both are done
    assert _ends("fair", *together) == pytest.approx({"a": 2.1, "b": 2.1})
    overlapping = [(0.0, (0, 1), (0.1, 1.0), "a"), (0.5, (1, 2), (0.0, 1.0), "b"),
                   (0.0, (3,), (0.1, 1.0), "alone")]
    assert _ends("fixed", *overlapping) == pytest.approx({"a": 1.1, "b": 2.5, "alone": 1.1})
    # fair: a moves 0.5 alone, then 0.5 at half pace (done at 1.5, ends after its 0.1);
    # b moves 0.5 at half pace until 1.5, then its last 0.5 alone
    assert _ends("fair", *overlapping) == pytest.approx({"a": 1.6, "b": 2.0, "alone": 1.1})
    # fair: the fixed cost (software, latencies) does not hold the links
    after = [(0.0, (0, 1), (1.0, 1.0), "a"), (1.5, (0, 1), (0.0, 1.0), "b")]
    assert _ends("fair", *after) == pytest.approx({"a": 2.0, "b": 2.5})
    assert _ends("fixed", *after) == pytest.approx({"a": 2.0, "b": 3.5})
    with pytest.raises(ValueError, match="link_sharing"):
        Network(link_sharing="shared")


def test_step_jitter_spreads_every_step_around_its_factor():
    plain = Speed("stragglers", count=1, factor=5.0).sampler(2, seed=3)
    assert [plain.factor(1) for _ in range(3)] == [5.0] * 3
    spread = Speed("stragglers", count=1, factor=5.0, jitter=0.1).sampler(2, seed=3)
    logs = np.log([spread.factor(1) for _ in range(20000)]) - math.log(5.0)
    assert np.mean(logs) == pytest.approx(0.0, abs=0.005)
    assert np.std(logs) == pytest.approx(0.1, rel=0.05)
    again = Speed("stragglers", count=1, factor=5.0, jitter=0.1).sampler(2, seed=3)
    assert again.factor(1) == pytest.approx(5.0 * math.exp(logs[0]))  # the seed decides
    assert spread.expected[1] == pytest.approx(5.0 * math.exp(0.1 ** 2 / 2))
    with pytest.raises(ValueError, match="jitter"):
        Speed(jitter=-0.1)
    args = build_parser().parse_args(["--link-sharing", "fair", "--step-jitter", "0.05"])
    scenario, _ = scenario_from_args(args)
    assert scenario.network.link_sharing == "fair" and scenario.speed.jitter == 0.05


def test_parameter_averaging_keeps_the_sum_and_gradient_averaging_keeps_agreement():
    w = Workers(SMALL, 6)
    for i in range(6):
        w.step_done(i)
    w.flush()
    total = w.params.sum(axis=0).copy()
    w.average_parameters((1, 2, 5))
    assert np.allclose(w.params.sum(axis=0), total)
    assert np.allclose(w.params[1], w.params[5]) and not np.allclose(w.params[0], w.params[1])
    g = Workers(SMALL, 4)
    for _ in range(3):
        for i in range(4):
            g.step_done(i)
        g.average_gradients(range(4))
    assert np.allclose(g.params, g.params[0]) and g.consensus_distance() < 1e-25


def test_a_gradient_is_taken_where_its_computation_started():
    """Asynchronous AD-PSGD averages a passive worker while it computes: its running step's
    gradient is the one at its parameters before the averaging, applied after it."""
    start = np.random.default_rng(5).standard_normal((2, SMALL.dim))
    alone = Workers(SMALL, 2)  # the same gradient draw, with nothing changing the parameters
    alone.params[:] = start
    alone.step_done(1)
    alone.flush()
    gradient = (start[1] - alone.params[1]) / SMALL.lr  # momentum starts at zero
    mixed = Workers(SMALL, 2)
    mixed.params[:] = start
    mixed.average_parameters((0, 1), computing=(1,))  # worker 1 is mid-computation
    mixed.step_done(1)
    mixed.flush()
    averaged = start.mean(axis=0)
    assert np.allclose(mixed.params[0], averaged)
    assert np.allclose(mixed.params[1], averaged - SMALL.lr * gradient)
    # the gradient at the averaged parameters would differ: the test can tell them apart
    moved = Workers(SMALL, 2)
    moved.params[:] = averaged
    moved.step_done(1)
    moved.flush()
    assert not np.allclose(moved.params[1], mixed.params[1])


def test_loss_curve_decreases_and_target_is_on_it():
    curve = allreduce_loss_curve(SMALL, 4, 100)
    assert curve[-1] < curve[10] < math.log(2)
    scenario = Scenario("allreduce", 4, Compute(0.1), problem=SMALL)
    assert target_loss(scenario, 100) == pytest.approx(curve[-1])


def test_per_step_source_uses_the_schedule_functions():
    scenario = Scenario("static", 8, Compute(0.1), network=Network(workers_per_node=4))
    source = PerStep(scenario)
    partition = static_partition(0, 8, 4)
    for w in range(8):
        ((seq, group),) = source.groups(w, 0)
        assert group == next(g for g in partition if w in g)
        assert seq == partition.index(group)
    adpsgd = PerStep(dataclasses.replace(scenario, mode="adpsgd-sync"))
    pairs = adpsgd_pairs(0, 3, 8)
    for w in range(8):
        assert adpsgd.groups(w, 3) == [p for p in pairs if w in p[1]]


def run(mode, speed=Speed(), workers=8, horizon=20.0, **kw):
    scenario = Scenario(mode, workers, Compute(0.1), speed, Network(workers_per_node=workers),
                        model_bytes=0, problem=SMALL, horizon_s=horizon, group_size=2, **kw)
    return simulate(scenario)


def test_homogeneous_runs_reach_the_ceiling_without_communication_cost():
    for mode in ("allreduce", "static", "random", "generator", "adpsgd", "adpsgd-sync"):
        result = run(mode)
        assert result.steps_per_s == pytest.approx(80.0, rel=0.02), mode
        assert result.fraction_of_ceiling == pytest.approx(1.0, rel=0.02)


def test_one_slow_worker_holds_back_allreduce_but_not_the_generator():
    slow = Speed("stragglers", count=1, factor=5.0)
    allreduce = run("allreduce", slow)
    assert allreduce.steps_per_s == pytest.approx(8 / 0.5, rel=0.02)  # n * min(v)
    generator = run("generator", slow)
    assert generator.fraction_of_ceiling >= 0.9
    assert generator.steps[7] < generator.steps[0] / 3  # the slow one still steps at its pace


def test_asynchronous_adpsgd_is_not_held_back_by_a_slow_worker_but_lock_step_is():
    slow = Speed("stragglers", count=1, factor=5.0)
    allreduce, lockstep, asynchronous = (run(m, slow) for m in ("allreduce", "adpsgd-sync",
                                                                 "adpsgd"))
    # lock-step pairs chain every worker to the slow one within a few steps
    assert lockstep.steps_per_s < 1.1 * allreduce.steps_per_s
    assert asynchronous.fraction_of_ceiling >= 0.95
    assert asynchronous.steps[7] < asynchronous.steps[0] / 3  # the slow (passive) one too
    assert asynchronous.groups == sum(asynchronous.steps[w] for w in range(0, 8, 2))


def test_a_passive_worker_serves_one_exchange_at_a_time_and_never_waits():
    # actives 0 and 2 share the only passive worker 1; an exchange takes 0.15 s (2 x 7.5e7
    # bytes at 1 GB/s), a step 0.1 s. Served one at a time, the passive is busy 0.3 s per
    # round of two exchanges, so each active steps every 0.3 s (0.25 s if served at once).
    net = Network(workers_per_node=3, intra=Link(0.0, 1e9))
    assert net.exchange_s(7.5e7, 1) == pytest.approx(0.15)
    result = simulate(Scenario("adpsgd", 3, Compute(0.1), network=net, model_bytes=7.5e7,
                               problem=SMALL, horizon_s=30.0, group_size=2))
    assert result.steps[0] == pytest.approx(30 / 0.3, abs=2)
    assert result.steps[2] == pytest.approx(30 / 0.3, abs=2)
    assert result.steps[1] == pytest.approx(30 / 0.1, abs=1)


def test_time_to_target_and_consensus_come_from_the_arithmetic():
    target = float(allreduce_loss_curve(SMALL, 8, 60)[-1])
    result = run("allreduce", target_loss=target, eval_every=1)
    # all-reduce reaches its own curve's value after about 60 steps of 0.1 s
    assert result.time_to_target_s == pytest.approx(6.0, abs=0.6)
    assert result.consensus_distance < 1e-20
    assert run("random", target_loss=target).consensus_distance > 0


def test_barrier_and_overlap_options():
    slow = Speed("random", probability=0.2, factor=5.0)
    free = run("random", slow)
    fenced = run("random", slow, barrier_every=2)
    assert fenced.steps_per_s < free.steps_per_s
    scenario = Scenario("allreduce", 8, Compute(0.1), network=Network(
        workers_per_node=1, inter=Link(0.0, 1e9)), model_bytes=4e7, problem=SMALL, horizon_s=10)
    plain, hidden = simulate(scenario), simulate(dataclasses.replace(scenario, overlap=1.0))
    assert plain.steps_per_s < 0.6 * hidden.steps_per_s
    assert hidden.steps_per_s == pytest.approx(80.0, rel=0.02)


def test_a_generator_request_pays_the_service_latency_once():
    # policy "all" answers at once: a step is 0.1 s of compute plus one request's 0.05 s
    def steps_per_s(mode, service_s):
        net = Network(workers_per_node=8, intra=Link(0.0, 1e9), service_s=service_s)
        return simulate(Scenario(mode, 8, Compute(0.1), network=net, model_bytes=0,
                                 problem=SMALL, horizon_s=20.0, group_size=2,
                                 policy="all")).steps_per_s
    assert steps_per_s("generator", 0.0) == pytest.approx(80.0, rel=0.02)
    assert steps_per_s("generator", 0.05) == pytest.approx(8 / 0.15, rel=0.02)
    assert steps_per_s("static", 0.05) == pytest.approx(80.0, rel=0.02)  # no service
    with pytest.raises(ValueError, match="service_s"):
        Network(service_s=-1.0)


def test_a_spread_service_cost_has_the_given_median_and_the_lognormal_mean():
    from ripples.sim.engine import _Run

    def costs(jitter, seed=0, draws=20_000):
        net = Network(workers_per_node=8, service_s=0.05, service_jitter=jitter)
        run = _Run(Scenario("generator", 8, Compute(0.1), network=net, problem=SMALL,
                            seed=seed), None)
        return np.array([run.service_cost() for _ in range(draws)])

    spread = costs(1.0)
    assert np.median(spread) == pytest.approx(0.05, rel=0.03)
    assert spread.mean() == pytest.approx(0.05 * math.exp(0.5), rel=0.04)
    assert np.percentile(spread, 90) == pytest.approx(0.05 * math.exp(1.2816), rel=0.05)
    assert np.array_equal(costs(1.0, draws=100), costs(1.0, draws=100))  # from the seed
    assert not np.array_equal(costs(1.0, seed=1, draws=100), costs(1.0, draws=100))
    assert set(costs(0.0, draws=100)) == {0.05}
    with pytest.raises(ValueError, match="service_jitter"):
        Network(service_jitter=-0.1)


def test_members_leave_a_collective_apart_by_exponential_shares_of_its_duration():
    from ripples.sim.engine import _Run

    def run(mean, seed=0):
        net = Network(workers_per_node=8, exit_early=mean)
        return _Run(Scenario("generator", 8, Compute(0.1), network=net, problem=SMALL,
                             seed=seed), None)

    spread = run(0.07)
    draws = [spread.early_exits(4) for _ in range(5_000)]
    # the last member (share 0) ends the collective; the others leave before it, each by
    # an exponential share of mean 0.07 (the excess of an exponential over the minimum)
    assert all(len(d) == 4 and min(d) == 0.0 and sorted(d)[1] > 0 for d in draws)
    earlier = np.array([share for d in draws for share in sorted(d)[1:]])
    assert earlier.mean() == pytest.approx(0.07, rel=0.05)
    assert np.median(earlier) == pytest.approx(0.07 * math.log(2), rel=0.06)
    assert run(0.07).early_exits(3) == run(0.07).early_exits(3)  # from the seed
    assert run(0.0).early_exits(4) is None and spread.early_exits(1) is None
    with pytest.raises(ValueError, match="exit_early"):
        Network(exit_early=-0.1)


def test_an_exchange_pays_its_own_overhead_not_a_collectives():
    # an AD-PSGD exchange is point-to-point, outside the engine a collective's overhead is for
    net = Network(workers_per_node=2, intra=Link(0.0, 1e9), overhead_s=5.0,
                  exchange_overhead_s=0.01)
    assert net.exchange_s(1e6, 1) == pytest.approx(0.01 + 2e-3)
    assert net.allreduce_s(1e6, 2, 1) == pytest.approx(5.0 + 2 * 0.5e6 / 1e9)  # ring: 2 steps
    with pytest.raises(ValueError, match="exchange_overhead_s"):
        Network(exchange_overhead_s=-1.0)


def test_scenario_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode must be one of"):
        Scenario("ring", 4, Compute(0.1))
    with pytest.raises(ValueError, match="group_size"):
        Scenario("random", 4, Compute(0.1), group_size=5)


def test_cli_help_explains_every_flag_and_runs(tmp_path, capsys):
    parser = build_parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    args = parser.parse_args(["--preset", "prague", "--inter-gbps", "25"])
    base, workers = scenario_from_args(args)
    assert workers == [64] and base.network.inter.bandwidth_Bps == pytest.approx(25e9 / 8)
    assert base.compute.seconds == pytest.approx(12.3e9 * 32 / 4e12)
    out = tmp_path / "sim.json"
    assert cli_main(["--workers", "8", "--modes", "allreduce,generator", "--step-ms", "10",
                     "--model-mb", "0", "--target-steps", "20", "--quiet", "--json",
                     str(out), "--horizon-s", "5"]) == 0
    assert "generator" in capsys.readouterr().out
    assert '"rows"' in out.read_text()
