"""ripplesrun: argument validation and command building without launching, plus real launches."""
import os
import subprocess
import sys

import pytest

from ripples.run import build_command, hostfile_slots, parse_args, parse_hosts


def build(argv, cpu_count=2, is_root=False, environ=None):
    return build_command(parse_args(argv), cpu_count, mpiexec="/opt/mpi/bin/mpiexec",
                         environ={"PATH": "/usr/bin"} if environ is None else environ,
                         is_root=is_root)


def x_values(argv):
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-x"]


def test_plain_command_within_cores():
    argv, env = build(["-np", "2", "python", "train.py", "--lr", "0.1"])
    assert argv == ["/opt/mpi/bin/mpiexec", "-n", "2", "python", "train.py", "--lr", "0.1"]
    assert env == {"PATH": "/usr/bin"}


def test_oversubscribe_only_beyond_cores():
    argv, _ = build(["-np", "8", "python", "t.py"], cpu_count=2)
    assert argv[3:6] == ["--oversubscribe", "--bind-to", "none"]
    argv, _ = build(["-np", "8", "python", "t.py"], cpu_count=8)
    assert "--oversubscribe" not in argv


def test_root_variables_only_as_root():
    _, env = build(["-np", "1", "true"], is_root=True)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    _, env = build(["-np", "1", "true"], is_root=False)
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env


def test_settings_are_passed_explicitly_to_ranks():
    argv, _ = build(["-np", "8", "--slowdown", "7:5,3:2", "--random-slowdown", "0.1:5",
                     "--compute-ms", "50", "--timeline", "/tmp/t.json", "--timeout", "30",
                     "--ps-servers", "2", "--seed", "4", "--verbose", "--metrics", "/tmp/m",
                     "python", "train.py"])
    assert sorted(x_values(argv)) == sorted([
        "RIPPLES_SLOWDOWN=7:5,3:2", "RIPPLES_RANDOM_SLOWDOWN=0.1:5", "RIPPLES_COMPUTE_MS=50.0",
        "RIPPLES_TIMELINE=/tmp/t.json", "RIPPLES_TIMEOUT_S=30.0", "RIPPLES_PS_SERVERS=2",
        "RIPPLES_SEED=4", "RIPPLES_VERBOSE=1", "RIPPLES_METRICS_PATH=/tmp/m"])
    assert argv[-2:] == ["python", "train.py"]


def test_fault_tolerant_runs_under_ulfm_over_tcp_and_tells_the_ranks():
    argv, _ = build(["-np", "4", "--fault-tolerant", "python", "t.py"], cpu_count=4)
    assert argv[3:12] == ["--with-ft", "ulfm", "--mca", "btl", "tcp,self", "--mca",
                          "async_mpi_finalize", "1", "-x"]
    assert x_values(argv) == ["RIPPLES_FAULT_TOLERANT=1"]
    argv, _ = build(["-np", "4", "python", "t.py"], cpu_count=4)
    assert "--with-ft" not in argv and not x_values(argv)


def test_passed_settings_are_valid_config_values():
    from ripples.config import Config
    argv, _ = build(["-np", "4", "--slowdown", "3:2", "--compute-ms", "12.5", "--timeout", "7",
                     "--seed", "3", "--verbose", "python", "t.py"])
    environ = dict(item.split("=", 1) for item in x_values(argv))
    config = Config.load(environ)
    assert (config.slowdown, config.compute_ms, config.timeout_s, config.seed, config.verbose) \
        == ("3:2", 12.5, 7.0, 3, True)


def test_hosts():
    assert parse_hosts("a:4,b:2,c") == [("a", 4), ("b", 2), ("c", 1)]
    argv, _ = build(["-np", "6", "-H", "a:4,b:2", "python", "t.py"], cpu_count=1)
    assert argv[3:5] == ["--host", "a:4,b:2"] and "--oversubscribe" not in argv
    argv, _ = build(["-np", "7", "-H", "a:4,b:2", "python", "t.py"], cpu_count=64)
    assert "--oversubscribe" in argv


def test_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1 slots=4\nnode2 slots=2  # small\n\nnode3\n")
    assert hostfile_slots(str(path)) == 7
    argv, _ = build(["-np", "8", "--hostfile", str(path), "python", "t.py"], cpu_count=64)
    assert argv[3:5] == ["--hostfile", str(path)] and "--oversubscribe" in argv


def test_double_dash_before_command():
    argv, _ = build(["-np", "1", "--", "python", "-c", "pass"])
    assert argv[-3:] == ["python", "-c", "pass"]


@pytest.mark.parametrize("argv, flag", [
    (["-np", "4", "--slowdown", "9:5", "python", "t.py"], "--slowdown"),
    (["-np", "4", "--slowdown", "x", "python", "t.py"], "--slowdown"),
    (["-np", "4", "--slowdown", "1:0.5", "python", "t.py"], "--slowdown"),
    (["-np", "4", "--random-slowdown", "1.5:2", "python", "t.py"], "--random-slowdown"),
    (["-np", "4", "--random-slowdown", "0.1:0", "python", "t.py"], "--random-slowdown"),
    (["-np", "0", "python", "t.py"], "-np"),
    (["-np", "4"], "command"),
    (["python", "t.py"], "-np"),
    (["-np", "4", "--compute-ms", "-1", "python"], "--compute-ms"),
    (["-np", "4", "--timeout", "0", "python"], "--timeout"),
    (["-np", "4", "--ps-servers", "4", "python"], "--ps-servers"),
    (["-np", "4", "-H", "a:x", "python"], "-H"),
    (["-np", "4", "--hostfile", "/nonexistent/hosts", "python"], "--hostfile"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def run_launcher(args, timeout=60):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ripples.run", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_bad_flag_launches_nothing(tmp_path):
    marker = tmp_path / "ran"
    result = run_launcher(["-np", "2", "--slowdown", "5:2", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w')"])
    assert result.returncode == 2 and "--slowdown" in result.stderr
    assert not marker.exists()


def test_launch_passes_settings_and_succeeds():
    code = ("from mpi4py import MPI; from ripples.config import Config; c = Config.load(); "
            "assert MPI.COMM_WORLD.size == 2; "
            "assert (c.slowdown, c.seed) == ('1:3', 5), c; "
            "print('rank', MPI.COMM_WORLD.rank, 'ok')")
    result = run_launcher(["-np", "2", "--slowdown", "1:3", "--seed", "5", "--timeout", "20",
                           sys.executable, "-c", code])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mpiexec -n 2" in result.stderr          # the command is printed before launching
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) \
        == ["rank 0 ok", "rank 1 ok"]


def test_launch_propagates_a_failing_rank_exit_status():
    code = ("import sys; from mpi4py import MPI; "
            "sys.exit(3 if MPI.COMM_WORLD.rank == 1 else 0)")
    result = run_launcher(["-np", "2", sys.executable, "-c", code])
    # Open MPI reports the status of the first rank that failed.
    assert result.returncode == 3, result.stdout + result.stderr
