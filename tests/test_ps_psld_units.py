"""PSLD's scheduler and the server slowness settings as pure logic (no processes)."""
import pytest

from ripples.ps import psld
from ripples.ps.slowness import ServiceCost, from_env


def test_stragglers_exceed_one_plus_delta_times_the_median():
    assert psld.stragglers({0: 1.0, 1: 1.05, 2: 1.3}, 0.1) == [2]
    assert psld.stragglers({0: 1.0, 1: 1.0}, 0.1) == []
    assert psld.stragglers({}, 0.1) == []


def test_greedy_minmax_balances_predicted_times_by_rate():
    sizes = [100] * 8
    owners = [c % 2 for c in range(8)]  # 400 bytes each
    rate = {0: 1.0, 1: 3.0}  # server 1 three times slower per byte
    moved = psld.greedy_minmax(sizes, owners, rate, [0, 1], max_moves=16)
    load = psld.loads(sizes, moved, [0, 1])
    # 800 bytes: 6 chunks on the fast server and 2 on the slow one give max(600, 600)
    assert load == {0: 600, 1: 200}


def test_greedy_minmax_scales_out_onto_a_spare_and_stops_when_nothing_improves():
    sizes = [100] * 6
    owners = [0] * 6
    moved = psld.greedy_minmax(sizes, owners, {0: 1.0, 1: 1.0, 2: 1.0}, [0, 1, 2], 16)
    assert psld.loads(sizes, moved, [0, 1, 2]) == {0: 200, 1: 200, 2: 200}
    assert psld.greedy_minmax(sizes, moved, {0: 1.0, 1: 1.0, 2: 1.0}, [0, 1, 2], 16) == moved


def test_rates_give_spares_the_median_of_servers_that_do_not_straggle():
    rate = psld.rates({0: 1.0, 1: 3.0}, {0: 100, 1: 100}, [0, 1, 2], 0.1)
    assert rate == {0: 0.01, 1: 0.03, 2: 0.01}


def feed(state, times, owners, iteration_s, n=None, servers=3):
    sizes = [100] * len(owners)
    active = tuple(sorted(set(owners)))
    decision = None
    for _ in range(n or state.config.window):
        decision = psld.observe(state, iteration_s, {s: times[s] for s in active}, sizes,
                                owners, active, servers)
    return decision


def test_a_straggler_triggers_exploitation_onto_fast_servers_and_the_spare():
    state = psld.new_state(psld.PSLDConfig(window=3, explore=False))
    owners = (0, 1, 0, 1, 0, 1)
    assert feed(state, {0: 0.3, 1: 0.9}, owners, 1.0, n=2) is None  # window not complete
    decision = feed(state, {0: 0.3, 1: 0.9}, owners, 1.0, n=1)
    assert decision.kind == "exploit"
    load = psld.loads([100] * 6, decision.owners, [0, 1, 2])
    assert load[1] < 300 and load[2] > 0  # off the slow server, onto the spare
    assert decision.active == tuple(sorted(set(decision.owners)))


def test_an_exploration_that_does_not_speed_up_is_rolled_back():
    state = psld.new_state(psld.PSLDConfig(window=2, epsilon=1.0, delta=0.5))
    owners = (0, 1, 0, 1)
    explored = feed(state, {0: 0.5, 1: 0.5}, owners, 1.0)
    assert explored.kind == "explore"
    assert sum(a != b for a, b in zip(owners, explored.owners)) == 1
    times = {s: 0.5 for s in range(3)}
    back = feed(state, times, explored.owners, 1.2)  # slower than before the exploration
    assert back.kind == "rollback" and back.owners == owners and back.active == (0, 1)
    assert state.counts["rollback"] == 1


def test_an_exploration_that_speeds_up_is_kept():
    state = psld.new_state(psld.PSLDConfig(window=2, epsilon=1.0, delta=0.5, seed=1))
    explored = feed(state, {0: 0.5, 1: 0.5}, (0, 1, 0, 1), 1.0)
    state.config = psld.PSLDConfig(window=2, epsilon=0.0, delta=0.5)  # no new exploration
    kept = feed(state, {s: 0.4 for s in range(3)}, explored.owners, 0.8)
    assert state.counts["kept"] == 1 and state.counts["rollback"] == 0
    assert kept is None or kept.kind != "rollback"


def test_scale_in_when_load_allows_and_not_when_it_does_not():
    cfg = psld.PSLDConfig(scale_in_slack=0.05)
    sizes = [100, 100, 100, 1]
    owners = (0, 0, 1, 2)  # server 2 holds a single tiny chunk
    rate = {0: 1.0, 1: 1.0, 2: 1.0}
    shrunk = psld.scale_in(sizes, owners, rate, (0, 1, 2), cfg)
    assert shrunk is not None and 2 not in shrunk
    assert psld.scale_in([100, 100], (0, 1), {0: 1.0, 1: 1.0}, (0, 1), cfg) is None


def test_config_rejects_bad_knobs():
    with pytest.raises(ValueError, match="window"):
        psld.PSLDConfig(window=0)
    with pytest.raises(ValueError, match="epsilon"):
        psld.PSLDConfig(epsilon=2.0)


def test_load_ratio():
    assert psld.load_ratio([1.0, 1.0]) == 1.0
    assert psld.load_ratio([3.0, 1.0]) == 1.5


def test_server_slowdown_settings():
    env = {"RIPPLES_SERVER_SLOWDOWN": "1:3", "RIPPLES_SERVER_COST": "2:10"}
    slow, normal = from_env(1, 3, env), from_env(0, 3, env)
    assert slow == ServiceCost(3.0, 0.002, 10e-9) and normal.factor == 1.0
    assert slow.delay_s(1000) == pytest.approx(3 * (0.002 + 1e-5))
    assert from_env(0, 3, {}) is None
    with pytest.raises(ValueError, match=r"RIPPLES_SERVER_SLOWDOWN.*servers \[2\] do not exist"):
        from_env(0, 2, {"RIPPLES_SERVER_SLOWDOWN": "2:3"})
    with pytest.raises(ValueError, match="RIPPLES_SERVER_SLOWDOWN"):
        from_env(0, 2, {"RIPPLES_SERVER_SLOWDOWN": "1:0.5"})  # faster than normal
    with pytest.raises(ValueError, match="RIPPLES_SERVER_COST"):
        from_env(0, 2, {"RIPPLES_SERVER_COST": "fast"})
