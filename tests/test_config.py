"""Config: explicit arguments > RIPPLES_* environment > defaults, validated."""
import warnings

import pytest

from ripples.core.config import Config


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


def unknown_variable_warnings(environ):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Config.load(environ=environ)
    return [str(w.message) for w in caught]


def test_a_mistyped_variable_gets_the_closest_name_only():
    messages = unknown_variable_warnings({"RIPPLES_TIMOUT_S": "5"})
    assert messages == ["unknown environment variable RIPPLES_TIMOUT_S ignored; did you mean "
                        "RIPPLES_TIMEOUT_S?"]
    # ripplesrun's flag names are close enough to their settings.
    assert unknown_variable_warnings({"RIPPLES_METRICS": "m.json"})[0].endswith(
        "did you mean RIPPLES_METRICS_PATH?")


def test_a_name_close_to_nothing_lists_the_valid_names():
    [message] = unknown_variable_warnings({"RIPPLES_FOO": "1"})
    assert "did you mean" not in message
    assert "RIPPLES_TIMEOUT_S" in message and "RIPPLES_LOG_LEVEL" in message


@pytest.mark.parametrize("rank_variable", ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"])
def test_unknown_variable_warned_by_world_rank_0_only(rank_variable):
    assert len(unknown_variable_warnings({"RIPPLES_TIMOUT_S": "5", rank_variable: "0"})) == 1
    assert unknown_variable_warnings({"RIPPLES_TIMOUT_S": "5", rank_variable: "1"}) == []
    # Open MPI's variable wins over the others when a launcher sets several.
    assert unknown_variable_warnings({"RIPPLES_TIMOUT_S": "5", "OMPI_COMM_WORLD_RANK": "3",
                                      "PMIX_RANK": "0"}) == []


def test_unknown_variable_warned_once_per_process():
    """However many times the configuration is loaded (a script, then init())."""
    import ripples.core.config
    ripples.core.config.__dict__.pop("__warningregistry__", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        Config.load(environ={"RIPPLES_TIMOUT_S": "5"})
        Config.load(environ={"RIPPLES_TIMOUT_S": "5"})  # another call site
    assert len(caught) == 1


@pytest.mark.parametrize("text,level", [("debug", "debug"), ("INFO", "info"),
                                        ("Warning", "warning"), ("error", "error")])
def test_log_level_parsed_case_insensitively(text, level):
    assert Config.load(environ={"RIPPLES_LOG_LEVEL": text}).log_level == level


def test_log_level_default_and_bad_value():
    assert Config.load(environ={}).log_level == "warning"
    with pytest.raises(ValueError, match="log_level must be 'debug' or 'info' or 'warning' or "
                                         "'error', got 'verbose'"):
        Config.load(environ={"RIPPLES_LOG_LEVEL": "verbose"})


def test_apply_log_level_sets_the_ripples_logger(monkeypatch):
    import logging
    logger = logging.getLogger("ripples")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    Config(log_level="error").apply_log_level()
    assert logger.level == logging.ERROR and logger.handlers == []
    Config(log_level="debug").apply_log_level()
    assert logger.level == logging.DEBUG
    assert [type(h) for h in logger.handlers] == [logging.StreamHandler]  # debug lines show
    Config(log_level="info").apply_log_level()
    assert logger.level == logging.INFO and len(logger.handlers) == 1  # not added twice


def test_apply_log_level_keeps_a_scripts_logging_setup(monkeypatch):
    import logging
    logger = logging.getLogger("ripples")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    Config(log_level="debug").apply_log_level()
    assert logger.level == logging.DEBUG and logger.handlers == []
