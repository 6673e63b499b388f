"""``ripplesrun --ps-spare``: validation and the variable it sets (no processes)."""
import pytest

from ripples.runner.launch import _ripples_settings, parse_args


def test_ps_spare_sets_its_variable():
    args = parse_args(["-np", "7", "--ps-servers", "2", "--ps-spare", "1", "python", "t.py"])
    assert _ripples_settings(args)["RIPPLES_PS_SPARE"] == "1"
    args = parse_args(["-np", "7", "--ps-servers", "2", "python", "t.py"])
    assert "RIPPLES_PS_SPARE" not in _ripples_settings(args)


@pytest.mark.parametrize("argv,message", [
    (["-np", "4", "--ps-spare", "1", "python"], "needs --ps-servers"),
    (["-np", "4", "--ps-servers", "2", "--ps-spare", "2", "python"], "must be in [0, 1]"),
    (["-np", "4", "--ps-servers", "1", "--ps-spare", "-1", "python"], "must be in [0, 2]"),
])
def test_ps_spare_must_leave_a_worker(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
