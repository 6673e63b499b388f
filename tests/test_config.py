"""Config: explicit arguments > RIPPLES_* environment > defaults, validated."""
import warnings

import pytest

from ripples.config import Config


def test_defaults():
    config = Config.load(environ={})
    assert config.timeout_s == 60.0 and config.cache_capacity == 64
    assert config.fusion_threshold_bytes == 64 * 1024 * 1024 and config.verbose is False


def test_environment_overrides_defaults_and_arguments_override_environment():
    environ = {"RIPPLES_TIMEOUT_S": "5", "RIPPLES_VERBOSE": "yes", "RIPPLES_SLOWDOWN": "7:5",
               "RIPPLES_CACHE_CAPACITY": "8"}
    config = Config.load(environ=environ, cache_capacity=3)
    assert config.timeout_s == 5.0 and config.verbose is True and config.slowdown == "7:5"
    assert config.cache_capacity == 3


def test_unknown_ripples_variable_warns_and_test_switches_do_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Config.load(environ={"RIPPLES_TIMEOUTS": "5", "RIPPLES_TEST_GPU": "1", "OTHER": "x"})
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "RIPPLES_TIMEOUTS" in messages[0]
    assert "RIPPLES_TIMEOUT_S" in messages[0]  # the valid names are listed


@pytest.mark.parametrize("environ,match", [
    ({"RIPPLES_TIMEOUT_S": "soon"}, "RIPPLES_TIMEOUT_S='soon' is not a valid float"),
    ({"RIPPLES_VERBOSE": "maybe"}, "RIPPLES_VERBOSE='maybe' is not a valid bool"),
    ({"RIPPLES_TIMEOUT_S": "0"}, "timeout_s must be a positive"),
    ({"RIPPLES_CACHE_CAPACITY": "0"}, "cache_capacity must be an integer >= 1"),
])
def test_bad_values_name_the_setting(environ, match):
    with pytest.raises(ValueError, match=match):
        Config.load(environ=environ)


def test_unknown_argument_lists_valid_settings():
    with pytest.raises(TypeError, match="no setting 'timeout'.*timeout_s"):
        Config.load(environ={}, timeout=3)


def test_config_is_frozen():
    with pytest.raises(Exception):
        Config().timeout_s = 1


def test_horovod_variables_apply_below_ripples_ones():
    """A Horovod job's HOROVOD_TIMELINE etc. keep working; RIPPLES_* and arguments win."""
    environ = {"HOROVOD_TIMELINE": "/tmp/h.json", "HOROVOD_FUSION_THRESHOLD": "1048576",
               "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
               "HOROVOD_OTHER": "ignored"}
    config = Config.load(environ=environ)
    assert (config.timeline, config.fusion_threshold_bytes, config.cycle_time_ms,
            config.stall_warning_s) == ("/tmp/h.json", 1048576, 2.5, 30.0)
    environ["RIPPLES_TIMELINE"] = "/tmp/r.json"
    assert Config.load(environ=environ).timeline == "/tmp/r.json"
    assert Config.load(environ=environ, timeline="").timeline == ""
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME"):
        Config.load(environ={"HOROVOD_CYCLE_TIME": "fast"})
