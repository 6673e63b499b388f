"""ripplesrun: argument validation and command building without launching, plus real launches."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import ripples
from ripples.comm import failures
from ripples.runner import job_process, leftovers
from ripples.runner.launch import (build_command, hostfile_slots, oversubscription_warning,
                                   parse_args, parse_env_spec, parse_hosts)


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
    from ripples.core.config import Config
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


def test_np_defaults_to_the_slots_of_hosts_or_hostfile_as_with_mpirun(tmp_path):
    argv, _ = build(["-H", "a:4,b:2", "python", "t.py"], cpu_count=1)
    assert argv[1:3] == ["-n", "6"] and "--oversubscribe" not in argv
    path = tmp_path / "hosts"
    path.write_text("node1 slots=2\nnode2\n")
    argv, _ = build(["--hostfile", str(path), "python", "t.py"], cpu_count=1)
    assert argv[1:3] == ["-n", "3"]
    # the checks that read -np read the slots (a bad --ps-servers: see the bad flags below)
    assert parse_args(["-H", "a:2", "--ps-servers", "1", "python"]).np == 2


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
    (["-np", "4", "--start-timeout", "-1", "python"], "--start-timeout"),
    (["-np", "4", "--ps-servers", "4", "python"], "--ps-servers"),
    (["-np", "4", "-H", "a:x", "python"], "-H"),
    (["-np", "4", "--hostfile", "/nonexistent/hosts", "python"], "--hostfile"),
    (["--hostfile", "/nonexistent/hosts", "python"], "--hostfile"),
    (["-H", "a:x", "python"], "-H"),
    (["-H", "a:2", "--ps-servers", "2", "python"], "--ps-servers"),
    (["-np", "4", "-x", "1BAD=2", "python"], "-x"),
    (["-np", "4", "-x", "=2", "python"], "-x"),
    (["-np", "4", "-x", "RIPPLES_SEED=1", "--seed", "2", "python"], "-x"),
    (["-np", "4", "--mpi-args", "'unclosed", "python"], "--mpi-args"),
    (["-np", "4", "--log-level", "loud", "python"], "--log-level"),
    (["-np", "4", "--verbos", "python"], "--verbos"),       # no abbreviations, as mpirun
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_np_aliases():
    for flags in (["-np", "3"], ["--np", "3"], ["-n", "3"], ["--num-proc", "3"], ["--np=3"]):
        argv, _ = build([*flags, "python", "t.py"], cpu_count=4)
        assert argv[:3] == ["/opt/mpi/bin/mpiexec", "-n", "3"], flags


def test_x_sets_and_forwards_variables():
    argv, env = build(["-np", "2", "-x", "FOO=1", "-x", "DATA_DIR", "-x", "EMPTY=", "--seed",
                       "3", "python", "t.py"], environ={"PATH": "/usr/bin", "DATA_DIR": "/d"})
    assert x_values(argv) == ["RIPPLES_SEED=3", "FOO=1", "DATA_DIR", "EMPTY="]
    assert argv[-2:] == ["python", "t.py"]
    # A forwarded value reaches mpiexec through its environment, not the printed line.
    assert env["DATA_DIR"] == "/d" and "/d" not in " ".join(argv)


def test_x_of_an_unset_variable_is_an_error():
    with pytest.raises(ValueError, match="-x: DATA_DIR is not set in this environment; set it "
                                         "or give a value: -x DATA_DIR=VALUE"):
        build(["-np", "2", "-x", "DATA_DIR", "python", "t.py"], environ={"PATH": "/usr/bin"})


def test_parse_env_spec():
    assert parse_env_spec("A_1=x=y") == ("A_1", "x=y")
    assert parse_env_spec("A") == ("A", None)
    assert parse_env_spec("A=") == ("A", "")
    for bad in ("", "=1", "1A", "A B=1", "A-B"):
        with pytest.raises(ValueError, match="-x"):
            parse_env_spec(bad)


def test_oversubscribe_flag_is_passed_once():
    argv, _ = build(["-np", "2", "--oversubscribe", "python", "t.py"], cpu_count=2)
    assert argv[3:5] == ["--oversubscribe", "python"]
    argv, _ = build(["-np", "8", "--oversubscribe", "python", "t.py"], cpu_count=2)
    assert argv[3:7] == ["--oversubscribe", "--bind-to", "none", "python"]


def test_fewer_slots_given_than_ranks_warns_unless_oversubscribe():
    args = parse_args(["-np", "4", "-H", "localhost:1", "python", "t.py"])
    assert oversubscription_warning(args, cpu_count=64) == (
        "4 ranks but 1 slot (-H localhost:1): running as mpirun --oversubscribe would, ranks "
        "share cores (give --oversubscribe to silence this)")
    argv, _ = build_command(args, 64, environ={}, is_root=False)
    assert argv[1:7] == ["-n", "4", "--host", "localhost:1", "--oversubscribe", "--bind-to"]
    for argv in (["-np", "4", "-H", "localhost:1", "--oversubscribe", "python"],
                 ["-np", "2", "-H", "a:1,b:1", "python"],
                 ["-np", "8", "python"]):               # more ranks than cores: no warning
        assert oversubscription_warning(parse_args(argv), cpu_count=2) is None, argv


def test_fewer_hostfile_slots_than_ranks_warns(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb slots=1\n")
    args = parse_args(["-np", "4", "--hostfile", str(path), "python"])
    assert oversubscription_warning(args, cpu_count=64).startswith(
        f"4 ranks but 3 slots (--hostfile {path})")


def test_mpi_args_are_split_and_go_before_the_command():
    argv, _ = build(["-np", "2", "--mpi-args", "--map-by socket --mca btl 'tcp,self'",
                     "--seed", "1", "python", "t.py"])
    assert argv[3:] == ["--map-by", "socket", "--mca", "btl", "tcp,self", "-x",
                        "RIPPLES_SEED=1", "python", "t.py"]
    argv, _ = build(["-np", "2", "--mpi-args=--report-bindings", "python", "t.py"])
    assert argv[3:] == ["--report-bindings", "python", "t.py"]


def test_output_filename_is_passed_to_mpiexec():
    argv, _ = build(["-np", "2", "--output-filename", "logs/run", "python", "t.py"])
    assert argv[3:] == ["--output-filename", "logs/run", "python", "t.py"]


def test_timeline_filename_is_timeline():
    argv, _ = build(["-np", "2", "--timeline-filename", "/tmp/t.json", "python", "t.py"])
    assert x_values(argv) == ["RIPPLES_TIMELINE=/tmp/t.json"]


def test_log_level_reaches_the_ranks_as_a_valid_setting():
    from ripples.core.config import Config
    argv, _ = build(["-np", "2", "--log-level", "DEBUG", "python", "t.py"])
    assert x_values(argv) == ["RIPPLES_LOG_LEVEL=debug"]
    assert Config.load(dict(item.split("=", 1) for item in x_values(argv))).log_level == "debug"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"ripplesrun {ripples.__version__} (ripples-mpi)\n"


@pytest.mark.parametrize("argv, hint", [
    (["-np", "2", "--timline", "t.json", "python"], "hint: did you mean --timeline?"),
    (["-np", "2", "--oversubscibe", "python"], "hint: did you mean --oversubscribe?"),
    (["-np", "2", "--bind-to", "none", "python"], 'in --mpi-args, e.g. --mpi-args "--bind-to'),
    (["python", "t.py"], "hint: give the number of ranks, e.g. ripplesrun -np 4"),
    (["-np", "2", "--log-level", "loud", "python"], "hint: `ripplesrun --help`"),
])
def test_usage_errors_come_with_a_hint(argv, hint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("usage: ripplesrun") and hint in err, err


def run_launcher(args, timeout=60, env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ripples.runner.launch", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_bad_flag_launches_nothing(tmp_path):
    marker = tmp_path / "ran"
    result = run_launcher(["-np", "2", "--slowdown", "5:2", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w')"])
    assert result.returncode == 2 and "--slowdown" in result.stderr
    assert not marker.exists()


def test_launch_passes_settings_and_succeeds():
    code = ("from mpi4py import MPI; from ripples.core.config import Config; c = Config.load(); "
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


def test_launch_x_reaches_every_rank():
    code = ("import os; from mpi4py import MPI; "
            "print('rank', MPI.COMM_WORLD.rank, os.environ['GIVEN'], os.environ['FORWARDED'])")
    result = run_launcher(["-np", "2", "-x", "GIVEN=a b=c", "-x", "FORWARDED", sys.executable,
                           "-c", code], env={"FORWARDED": "from-here"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) \
        == ["rank 0 a b=c from-here", "rank 1 a b=c from-here"]


def test_launch_x_of_an_unset_variable_launches_nothing():
    result = run_launcher(["-np", "2", "-x", "SURELY_UNSET_VARIABLE_OF_THIS_TEST",
                           sys.executable, "-c", "print('ran')"])
    assert result.returncode == 2 and "ran" not in result.stdout
    assert "SURELY_UNSET_VARIABLE_OF_THIS_TEST is not set" in result.stderr


def test_launch_mistyped_setting_warned_once_per_job_and_log_level_arrives():
    code = ("from mpi4py import MPI; from ripples.core.config import Config; "
            "print('rank', MPI.COMM_WORLD.rank, Config.load().log_level)")
    result = run_launcher(["-np", "2", "-x", "RIPPLES_TIMOUT_S=5", "--log-level", "info",
                           sys.executable, "-c", code])
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) \
        == ["rank 0 info", "rank 1 info"]
    assert result.stderr.count("did you mean RIPPLES_TIMEOUT_S?") == 1, result.stderr


def test_launch_more_ranks_than_given_slots_warns_and_runs():
    code = "from mpi4py import MPI; print('rank', MPI.COMM_WORLD.rank)"
    result = run_launcher(["-np", "3", "-H", "localhost:1", sys.executable, "-c", code])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ripplesrun: warning: 3 ranks but 1 slot (-H localhost:1)" in result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) \
        == ["rank 0", "rank 1", "rank 2"]


def test_launch_horovodrun_style_flags(tmp_path):
    trace = tmp_path / "t.json"
    code = ("import ripples.torch as hvd; hvd.init(); hvd.allreduce(__import__('torch')."
            "ones(1), name='x'); print('rank', hvd.rank()); hvd.shutdown()")
    result = run_launcher(["--np", "2", "--oversubscribe", "--timeline-filename", str(trace),
                           "--mpi-args", "--bind-to none", sys.executable, "-c", code],
                          timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--oversubscribe --bind-to none" in result.stderr   # the printed mpiexec line
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) \
        == ["rank 0", "rank 1"]
    assert {event["pid"] for event in json.loads(trace.read_text())} == {0, 1}


def test_launch_output_filename_collects_each_ranks_output(tmp_path):
    prefix = tmp_path / "out" / "job"
    prefix.parent.mkdir()
    code = "from mpi4py import MPI; print('output of rank', MPI.COMM_WORLD.rank)"
    result = run_launcher(["-np", "2", "--output-filename", str(prefix), sys.executable, "-c",
                           code])
    assert result.returncode == 0, result.stdout + result.stderr
    # Open MPI 5 writes PREFIX.JOB.RANK.out, Open MPI 4 PREFIX/1/rank.N/stdout.
    written = "".join(p.read_text() for p in sorted(prefix.parent.rglob("*"))
                      if p.is_file() and str(p).startswith(str(prefix)))
    assert sorted(written.splitlines()) == ["output of rank 0", "output of rank 1"]


def test_launch_log_level_info_shows_the_ripples_loggers_info_lines():
    code = ("import logging, ripples.torch as hvd; hvd.init(); "
            "logging.getLogger('ripples').info('hello from rank %d', hvd.rank()); hvd.shutdown()")
    for flags, shown in (([], False), (["--log-level", "info"], True)):
        result = run_launcher(["-np", "2", *flags, sys.executable, "-c", code], timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        for rank in range(2):
            assert (f"ripples INFO: hello from rank {rank}" in result.stderr) == shown, flags


# Open MPI's reports, as its mpiexec prints them (the first on standard output).
DAEMON_ENDED = """------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    h1
  Remote host:   h2
  Daemon exit status: {status}

This may also be caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
------------------------------------------------------------"""
LOST_DAEMON = """------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-h1-1234@0,0] on node h1
  Remote daemon: [prterun-h1-1234@0,2] on node h2

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
------------------------------------------------------------"""


def _stand_in_mpiexec(tmp_path, first, later="echo ran"):
    """A stand-in for mpiexec: its first run is the shell lines ``first``, every later run
    ``later``; the file it returns counts the runs. What is tested is launcher logic alone."""
    tries = tmp_path / "tries"
    script = tmp_path / "mpiexec"
    script.write_text(f"""#!/bin/sh
echo x >> {tries}
if [ $(wc -l < {tries}) -eq 1 ]; then
{first}
fi
{later}
""")
    script.chmod(0o755)
    return [str(script)], tries


def _saying(tmp_path, text, stream):
    """Shell lines printing ``text`` (kept in a file) on ``stream`` (1 or 2)."""
    said = tmp_path / f"said{stream}"
    said.write_text(text + "\n")
    return f"cat {said} >&{stream}"


@pytest.mark.parametrize("message, stream", [
    ("[vm:01234] PMIx server's listener thread failed to start", 2),
    (DAEMON_ENDED.format(status=0), 1), (DAEMON_ENDED.format(status=1), 1)])
def test_a_launch_open_mpi_failed_to_start_is_made_once_more(tmp_path, capfd, message,
                                                             stream):
    argv, tries = _stand_in_mpiexec(tmp_path, f"{_saying(tmp_path, message, stream)}; exit 213")
    assert job_process.run_job(argv, dict(os.environ)) == 0
    assert tries.read_text().count("x") == 2
    assert "failed to start the job before any rank ran" in capfd.readouterr().err


def test_a_job_failing_for_another_reason_is_not_launched_again(tmp_path):
    argv, tries = _stand_in_mpiexec(
        tmp_path, f"{_saying(tmp_path, 'Traceback: ValueError', 2)}; exit 1")
    assert job_process.run_job(argv, dict(os.environ)) == 1
    assert tries.read_text().count("x") == 1


ABORTED = """MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
  Proc: [[2895,1],1]
  Errorcode: 1"""


@pytest.mark.parametrize("mpiexec_after_the_report", ["exit 1", "sleep 60"])
def test_a_job_a_rank_aborted_is_not_launched_again_whatever_open_mpi_says_next(
        tmp_path, capfd, monkeypatch, mpiexec_after_the_report):
    """A host cut off after a rank aborted: Open MPI then says its daemon there 'failed to
    report back' (status 0), words it also uses for a failed start; and it may never end
    (``sleep``), so ripplesrun stops it. The ranks ran: starting the job again is wrong."""
    monkeypatch.setattr(job_process, "ABORT_GRACE_S", 1.0)
    argv, tries = _stand_in_mpiexec(
        tmp_path, f"{_saying(tmp_path, ABORTED, 2)}; "
        f"{_saying(tmp_path, DAEMON_ENDED.format(status=0), 1)}; {mpiexec_after_the_report}")
    began = time.monotonic()
    assert job_process.run_job(argv, dict(os.environ)) == 1
    assert time.monotonic() - began < 30
    assert tries.read_text().count("x") == 1
    assert "starting it once more" not in capfd.readouterr().err


@pytest.mark.parametrize("report, stream, status", [
    (LOST_DAEMON, 2, 0),  # Open MPI exits 0 then
    (DAEMON_ENDED.format(status=137), 1, 137)])  # the daemon's shell killed with its host
def test_a_lost_host_fails_the_job_naming_it_and_is_not_launched_again(tmp_path, capfd,
                                                                       report, stream,
                                                                       status):
    argv, tries = _stand_in_mpiexec(
        tmp_path, f"echo READY; {_saying(tmp_path, report, stream)}; exit {status}")
    code = job_process.run_job(argv, dict(os.environ))
    assert code == (status or job_process.EXIT_HOST_LOST) and code != 0
    assert tries.read_text().count("x") == 1
    out, err = capfd.readouterr()
    assert "READY" in out and report.splitlines()[1] in (out if stream == 1 else err)
    assert "host(s) h2 were lost" in err
    assert "starting it once more" not in err


PROCTABLE = """(rank, host, exe, pid) = (0, h1, /usr/bin/python, 101)
(rank, host, exe, pid) = (1, h2, /usr/bin/python, 102)"""


def test_a_job_whose_ranks_do_not_all_start_is_stopped_at_the_start_timeout(tmp_path, capfd):
    """Open MPI waits for good for a daemon that cannot connect back: mpiexec never prints
    its table of started ranks (``sleep``)."""
    argv, tries = _stand_in_mpiexec(tmp_path, "sleep 60")
    began = time.monotonic()
    code = job_process.run_job(argv, dict(os.environ), start_timeout_s=1.0)
    assert code == job_process.EXIT_NOT_STARTED != 0
    assert time.monotonic() - began < 15
    assert tries.read_text().count("x") == 1
    err = capfd.readouterr().err
    assert "did not start every rank within 1 s (--start-timeout)" in err
    assert "starting it once more" not in err


def test_a_job_whose_ranks_started_runs_past_the_start_timeout_without_the_table_shown(
        tmp_path, capfd):
    asked = tmp_path / "asked"
    argv, _ = _stand_in_mpiexec(
        tmp_path, f'echo "$1" > {asked}; echo before >&2; {_saying(tmp_path, PROCTABLE, 2)}; '
        "echo after >&2; sleep 2; echo ran; exit 0", later="")
    assert job_process.run_job(argv, dict(os.environ), start_timeout_s=0.5) == 0
    assert asked.read_text().strip() == job_process.PROCTABLE_OPTION
    out, err = capfd.readouterr()
    assert out == "ran\n"
    assert err == "before\nafter\n"


def test_ranks_of_this_host_alive_after_mpiexec_ended_are_killed_and_named(tmp_path, capfd):
    """mpiexec gave up on a frozen rank and ended without it: that rank, found in the table
    of started ranks, is killed. A process in another host's row, or one of this host that
    mpiexec did not start, is not touched."""
    pids = tmp_path / "pids"
    host = socket.gethostname()
    stranger = subprocess.Popen(["sleep", "300"])  # not below the stand-in mpiexec
    argv, _ = _stand_in_mpiexec(tmp_path, f"""sleep 300 >/dev/null 2>&1 & left=$!
sleep 300 >/dev/null 2>&1 & other=$!
echo "$left $other" > {pids}
echo "(rank, host, exe, pid) = (0, {host}, /bin/sleep, $left)" >&2
echo "(rank, host, exe, pid) = (1, elsewhere, /bin/sleep, $other)" >&2
echo "(rank, host, exe, pid) = (2, {host}, /bin/sleep, {stranger.pid})" >&2
sleep 0.5
exit 1""", later="")
    code = job_process.run_job(argv, dict(os.environ), start_timeout_s=30.0)
    left, other = map(int, pids.read_text().split())
    try:
        assert code == 1
        end = time.monotonic() + 5
        while leftovers.start_ticks(left) is not None and time.monotonic() < end:
            time.sleep(0.05)
        assert leftovers.start_ticks(left) is None  # gone (or a zombie until reaped)
        assert leftovers.start_ticks(other) is not None
        assert stranger.poll() is None
        err = capfd.readouterr().err
        assert f"rank 0 (pid {left}) of this host outlived mpiexec" in err, err
        assert str(other) not in err and str(stranger.pid) not in err
    finally:
        for pid in (left, other, stranger.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        stranger.wait()


def test_a_rank_still_exiting_when_mpiexec_ends_is_not_called_left_behind(tmp_path, capfd):
    """mpiexec may end while the ranks it signalled (Ctrl-C, an abort) are still exiting; a
    rank that ends within LEFTOVER_GRACE_S is not named "frozen or blocked for good"."""
    pids = tmp_path / "pids"
    host = socket.gethostname()
    exiting_s = 1.0  # within LEFTOVER_GRACE_S
    argv, _ = _stand_in_mpiexec(tmp_path, f"""sleep {exiting_s} >/dev/null 2>&1 & left=$!
echo "$left" > {pids}
echo "(rank, host, exe, pid) = (0, {host}, /bin/sleep, $left)" >&2
sleep 0.3
exit 1""", later="")
    assert job_process.run_job(argv, dict(os.environ), start_timeout_s=30.0) == 1
    assert leftovers.start_ticks(int(pids.read_text())) is None
    assert "outlived" not in capfd.readouterr().err


def test_start_timeout_flag():
    assert parse_args(["-np", "2", "x"]).start_timeout == 120
    assert parse_args(["-np", "2", "--start-timeout", "0", "x"]).start_timeout == 0


def test_output_passes_through_unchanged_to_the_same_stream(tmp_path, capfd):
    argv, _ = _stand_in_mpiexec(tmp_path, "printf 'a\\rb\\n'; printf 'e\\n' >&2; exit 0")
    assert job_process.run_job(argv, dict(os.environ)) == 0
    out, err = capfd.readouterr()
    assert out == "a\rb\n"
    assert err == "e\n"


def test_output_is_drained_after_the_sink_closes(tmp_path):
    """``ripplesrun ... | head``: once the reader is gone the copier stops writing but keeps
    reading, so mpiexec never blocks on a full pipe, and still sees Open MPI's reports."""
    class ClosedSink:
        def write(self, data):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    read_end, write_end = os.pipe()
    report = job_process.JobReport()
    copier = job_process.StreamCopier(os.fdopen(read_end, "rb"), ClosedSink(), report)
    copier.start()

    def mpiexec():
        with os.fdopen(write_end, "wb") as source:  # more than a pipe's buffer holds
            source.write(b"x" * (1 << 20) + b"\n" + LOST_DAEMON.encode())

    writer = threading.Thread(target=mpiexec, daemon=True)
    writer.start()
    writer.join(timeout=10)
    copier.join(timeout=10)
    assert not writer.is_alive(), "the writer blocked: nothing read the pipe"
    assert not copier.is_alive()
    assert report.lost == ["h2"]


def test_reports_that_come_in_one_long_read_are_all_taken_in():
    """Several ranks' tracebacks can reach the copier in one read, longer than the window
    it keeps: the departure that heads it still counts (it was cut off once, and a job
    whose reachable ranks had all left was waited on for good)."""
    def left_as_dead(rank):
        return (f"ripples: {failures.LEFT_AS_DEAD} ({failures.LAUNCH_RANK} {rank}; fault "
                "tolerant: the others go on)\n").encode()

    read_end, write_end = os.pipe()
    report = job_process.JobReport()
    report.read(b"".join(f"(rank, host, exe, pid) = ({r}, h1, python, {100 + r})\n".encode()
                         for r in range(3)))
    report.read(f"ripples: {failures.LEFT_BEHIND} [2] (on h2)\n".encode())
    copier = job_process.StreamCopier(os.fdopen(read_end, "rb"), None, report)
    copier.start()
    with os.fdopen(write_end, "wb") as source:  # one write, read at once
        source.write(left_as_dead(0) + b"  File ...\n" * 3000 + left_as_dead(1))
    copier.join(timeout=10)
    assert report.left_as_dead == {0, 1}
    assert report.nobody_left

