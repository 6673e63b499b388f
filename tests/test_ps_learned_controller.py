"""The analytic PS timing model and the learned CASP controller (inference only: the
training script is run by hand)."""
import importlib.util
import math

import pytest
import torch

from mpi_launch import REPO_DIR
from ripples.ps import casp, casp_timing
from ripples.ps import learned_controller as lc

TWO_CLASSES = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0, 3.0]


def load_benchmark():
    path = REPO_DIR / "benchmarks" / "train_casp_controller.py"
    spec = importlib.util.spec_from_file_location("train_casp_controller", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_round_time_is_slowest_member_plus_push_and_pull():
    rounds = casp_timing.round_times([1, 1, 2, 2], ((0, 1), (2, 3)), push_s=0.5, pull_s=0.5,
                                     server_s=0.0)
    assert rounds == pytest.approx([2.0, 3.0])
    # 1/2 + 1/3 updates per second: during a 2 s round 2/3 other updates land, 3 s -> 1.5.
    assert casp_timing.staleness(rounds) == pytest.approx([2 / 3, 1.5])


def test_a_busy_server_stretches_every_round():
    # Two lone workers push every 1 s, each push keeps the server busy 1 s: load 2.
    assert casp_timing.round_times([1, 1], ((0,), (1,)), push_s=0, pull_s=0,
                                   server_s=1.0) == pytest.approx([2.0, 2.0])
    # Load 0.5 leaves the rounds as they are.
    assert casp_timing.round_times([1, 1], ((0,), (1,)), push_s=0, pull_s=0,
                                   server_s=0.25) == pytest.approx([1.0, 1.0])


def test_reward_by_hand():
    # Rounds 2 s and 3 s, 2 members each: 1 and 2/3 batches per second, discounted by
    # sqrt(1 + 2/3) and sqrt(1 + 1.5); 5/6 pushes per second for 5/3 batches per second,
    # so the traffic penalty 0.1 removes 5 %.
    expected = (1 / math.sqrt(5 / 3) + (2 / 3) / math.sqrt(2.5)) * 0.95
    got = casp_timing.reward([1, 1, 2, 2], ((0, 1), (2, 3)), 0.1, push_s=0.5, pull_s=0.5,
                             server_s=0.0)
    assert got == pytest.approx(expected)
    # One community of 4 with a 3 s round: 4/3 batches per second, 1/4 push per batch.
    assert casp_timing.reward([1, 1, 2, 2], ((0, 1, 2, 3),), 0.1, push_s=0.5, pull_s=0.5,
                              server_s=0.0) == pytest.approx(4 / 3 * (1 - 0.1 / 4))


def test_without_costs_the_reward_is_what_choose_maximizes():
    times = [1.0, 1.3, 2.2, 2.5, 4.0]
    for count in range(1, 6):
        plan = casp.sort_and_cut(times, count)
        assert casp_timing.reward(times, plan, push_s=0, pull_s=0, server_s=0) == \
            pytest.approx(casp.projected_score(times, plan))


def test_features_by_hand():
    x = lc.features([2.0, 1.0], count=1, staleness=0.0, loss_slope=-3.0)
    assert x.tolist()[:2] == [1.0, 0.5] and x[2:lc.MAX_WORKERS].abs().sum() == 0
    assert x.tolist()[lc.MAX_WORKERS:] == pytest.approx([2 / 16, 0.5, 0.0, -1.0])


def test_candidate_features_by_hand():
    # Times 1, 1, 2 and the default costs: push + pull 0.1, a push busies the server 0.02.
    rows = lc.candidates([1.0, 1.0, 2.0])
    # C = 1: one 2.1 s round; the fast ones do not compute for 1.1 s of it, the slow one
    # for 0.1 s (the push and pull); 3 batches and 1 push per round.
    assert rows[0].tolist() == pytest.approx([1 / 3, (1.1 + 1.1 + 0.1) / 2.1 / 3, 1 / 2.1, 0.0,
                                              1 / 3],
                                             rel=1e-6)
    # C = 2: {0, 1} in 1.1 s rounds, {2} in 2.1 s rounds; only the push and pull idle them.
    rates = 1 / 1.1 + 1 / 2.1
    stale = (2 * 1.1 * (1 / 2.1) + 2.1 * (1 / 1.1)) / 3
    assert rows[1].tolist() == pytest.approx(
        [2 / 3, (0.1 / 1.1 * 2 + 0.1 / 2.1) / 3, (2 / 1.1 + 1 / 2.1) / 3, stale / 3, rates / (2 / 1.1 + 1 / 2.1)], rel=1e-6)
    assert rows[3:].abs().sum() == 0


def test_shipped_weights_load_and_are_small():
    assert lc.WEIGHTS.stat().st_size < 64 * 1024
    model = lc.load()
    logits, value = model(lc.features(TWO_CLASSES, 1, 0.0), lc.candidates(TWO_CLASSES))
    assert logits.shape == (lc.MAX_WORKERS,) and torch.isfinite(value)


def test_two_speed_classes_get_two_communities():
    policy = lc.LearnedPolicy(online=False)
    plan = policy.choose(TWO_CLASSES, casp.contiguous(8, 1))
    assert plan == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_controller_routes_learned_to_the_learned_policy():
    state = casp.Controller(8, casp.LEARNED, regroup_every=1)
    assert state.plan == ((0, 1, 2, 3, 4, 5, 6, 7),)
    casp.observe(state, 0, state.plan[0], dict(enumerate(TWO_CLASSES)))
    assert casp.regroup(state)
    assert state.plan == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert isinstance(state.learned, lc.LearnedPolicy)


def test_online_learning_moves_the_server_copy_only():
    shipped = lc.WEIGHTS.read_bytes()
    policy = lc.LearnedPolicy(online=True, lr=0.1)
    before = [p.detach().clone() for p in policy.model.parameters()]
    policy.choose(TWO_CLASSES, casp.contiguous(8, 1))
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    policy.choose(TWO_CLASSES, casp.sort_and_cut(TWO_CLASSES, 2))
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    assert lc.WEIGHTS.read_bytes() == shipped


def test_evaluation_is_deterministic_and_covers_the_held_out_mixes():
    bench = load_benchmark()
    model = lc.load()
    first, second = bench.evaluate(model, seed=3), bench.evaluate(model, seed=3)
    assert first == second
    assert {"classes_1_1/3", "one_3x_slow"} <= set(first)
    assert first["classes_1_1/3"]["learned_C"] == 2
    for row in first.values():
        assert row["learned_reward"] <= row["best_reward"] * (1 + 1e-12)
