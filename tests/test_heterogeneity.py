"""Slowdown parsing and the injector's padding/slowdown math, with a fake clock and sleep."""
import time

import pytest

from ripples.core.config import Config
from ripples.core.heterogeneity import SlowdownInjector, parse_random_slowdown, parse_slowdown


class FakeTime:
    """A clock that only moves when work is simulated or sleep is called."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def work(self, seconds):
        self.now += seconds


def make(rank=0, **kwargs):
    fake = FakeTime()
    return fake, SlowdownInjector(rank, clock=fake.clock, sleep=fake.sleep, **kwargs)


def test_parse_slowdown():
    assert parse_slowdown("7:5,3:2") == {7: 5.0, 3: 2.0}
    assert parse_slowdown(" 0:1.5 ") == {0: 1.5}
    assert parse_slowdown("") == {}
    assert parse_slowdown("3:2", world_size=4) == {3: 2.0}


@pytest.mark.parametrize("spec, fragment", [
    ("x", "not RANK:FACTOR"),
    ("a:2", "not an integer"),
    ("1:b", "not a number"),
    ("1:0.5", ">= 1"),
    ("1:nan", ">= 1"),
    ("-1:2", ">= 0"),
    ("1:2,1:3", "listed twice"),
    ("9:5", "does not exist"),
])
def test_parse_slowdown_errors_name_the_setting(spec, fragment):
    with pytest.raises(ValueError) as err:
        parse_slowdown(spec, world_size=4, setting="--slowdown")
    assert "--slowdown" in str(err.value) and fragment in str(err.value)


def test_parse_random_slowdown():
    assert parse_random_slowdown("0.1:5") == (0.1, 5.0)
    assert parse_random_slowdown("") == (0.0, 1.0)
    for spec, fragment in [("1.5:2", "[0, 1]"), ("-0.1:2", "[0, 1]"), ("0.1:0.5", ">= 1"),
                           ("0.1", "not P:FACTOR"), ("p:2", "not a number")]:
        with pytest.raises(ValueError, match="random_slowdown") as err:
            parse_random_slowdown(spec)
        assert fragment in str(err.value)


def test_fast_rank_never_sleeps():
    fake, inj = make(rank=1, factors={7: 5.0})
    for _ in range(3):
        with inj.step():
            fake.work(0.2)
    assert fake.sleeps == [] and inj.slept_s == 0.0 and inj.steps == 3
    assert not inj.enabled


def test_slow_rank_sleeps_factor_minus_one_times_step():
    fake, inj = make(rank=7, factors={7: 5.0})
    with inj.step():
        fake.work(0.25)
    assert fake.sleeps == [pytest.approx(1.0)]      # (5 - 1) * 0.25
    assert inj.slowed_s == pytest.approx(1.0) and inj.padded_s == 0.0
    assert inj.slow_steps == 1


def test_padding_then_slowdown_of_padded_time():
    fake, inj = make(rank=2, factors={2: 3.0}, compute_ms=50)
    start = fake.now
    with inj.step():
        fake.work(0.010)
    # padded to 50 ms (sleep 40 ms), then (3 - 1) * 50 ms = 100 ms more: 150 ms in total.
    assert inj.padded_s == pytest.approx(0.040)
    assert inj.slowed_s == pytest.approx(0.100)
    assert fake.now - start == pytest.approx(0.150)
    assert inj.last_sleep_s == pytest.approx(0.140)


def test_padding_does_not_shorten_a_long_step():
    fake, inj = make(compute_ms=50)
    with inj.step():
        fake.work(0.080)
    assert inj.slept_s == 0.0


def test_finish_step_with_measured_time():
    fake, inj = make(rank=0, factors={0: 2.0}, compute_ms=20)
    assert inj.finish_step(0.005) == pytest.approx(0.015 + 0.020)
    with pytest.raises(ValueError, match="elapsed_s"):
        inj.finish_step(-1)


def test_random_slowdown_is_deterministic_and_has_the_right_rate():
    _, a = make(rank=3, random=(0.1, 5.0), seed=11)
    _, b = make(rank=3, random=(0.1, 5.0), seed=11)
    _, other_rank = make(rank=4, random=(0.1, 5.0), seed=11)
    steps = range(4000)
    pattern = [a.factor_at(s) for s in steps]
    assert pattern == [b.factor_at(s) for s in steps]
    assert pattern != [other_rank.factor_at(s) for s in steps]
    assert set(pattern) == {1.0, 5.0}
    rate = pattern.count(5.0) / len(pattern)
    assert 0.08 < rate < 0.12


def test_random_and_fixed_factors_multiply():
    _, inj = make(rank=0, factors={0: 2.0}, random=(1.0, 5.0))
    assert inj.factor_at(0) == 10.0
    _, never = make(rank=0, random=(0.0, 5.0))
    assert {never.factor_at(s) for s in range(100)} == {1.0}


def test_random_slowdown_sleep_follows_draws():
    fake, inj = make(rank=1, random=(0.5, 3.0), seed=5)
    expected = []
    for s in range(20):
        with inj.step():
            fake.work(0.1)
        expected.append((inj.factor_at(s) - 1) * 0.1)
    assert inj.slept_s == pytest.approx(sum(expected))
    assert inj.slow_steps == sum(1 for e in expected if e > 0)


def test_exception_in_step_does_not_sleep_or_count():
    fake, inj = make(rank=0, factors={0: 5.0})
    with pytest.raises(RuntimeError):
        with inj.step():
            fake.work(0.1)
            raise RuntimeError("boom")
    assert fake.sleeps == [] and inj.steps == 0


def test_from_config():
    config = Config(slowdown="1:4", random_slowdown="0.25:2", compute_ms=30, seed=9)
    inj = SlowdownInjector.from_config(config, rank=1)
    assert (inj.factor, inj.random_p, inj.random_factor, inj.compute_s, inj.seed) == \
        (4.0, 0.25, 2.0, 0.030, 9)
    assert SlowdownInjector.from_config(config, rank=0).factor == 1.0
    with pytest.raises(ValueError, match="RIPPLES_SLOWDOWN"):
        SlowdownInjector.from_config(Config(slowdown="5:2"), rank=0, world_size=4)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="rank"):
        SlowdownInjector(-1)
    with pytest.raises(ValueError, match="factors"):
        SlowdownInjector(0, factors={0: 0.5})
    with pytest.raises(ValueError, match="compute_ms"):
        SlowdownInjector(0, compute_ms=-1)
    with pytest.raises(ValueError, match="random"):
        SlowdownInjector(0, random=(2.0, 3.0))


def test_real_sleep_smoke():
    inj = SlowdownInjector(0, compute_ms=5)
    start = time.perf_counter()
    with inj.step():
        pass
    assert time.perf_counter() - start >= 0.004
