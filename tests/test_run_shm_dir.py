"""ripplesrun gives a job whose ranks all run on this host a shared-memory directory of its
own (``--mca btl_sm_backing_directory``) and removes it when the job ends: Open MPI names
segment files after a job id derived from mpiexec's process id and leaves them behind when
mpiexec is killed, so a later job could otherwise open a dead job's file."""
import os
import sys
from pathlib import Path

import pytest

from mpi_launch import mpi_env, run_launcher
from ripples.runner.launch import (SHM_DIR_PARAM, build_command, job_shm_dir,
                                   may_use_other_hosts, parse_args)

needs_dev_shm = pytest.mark.skipif(not os.access("/dev/shm", os.W_OK),
                                   reason="no writable /dev/shm (not Linux)")


def test_the_directory_goes_on_the_command_line_before_the_script():
    argv, _ = build_command(parse_args(["-np", "2", "python", "x.py"]), 2, environ={},
                            is_root=False, shm_dir="/dev/shm/ripples-job-x")
    at = argv.index("--mca")
    assert argv[at:at + 3] == ["--mca", SHM_DIR_PARAM, "/dev/shm/ripples-job-x"]
    assert at < argv.index("python")


@pytest.mark.parametrize("argv,environ", [
    (["-np", "2", "-H", "h1:1,h2:1", "python", "x.py"], {}),  # ranks on other hosts
    (["-np", "2", "--mpi-args", f"--mca {SHM_DIR_PARAM} /mine", "python", "x.py"], {}),
    (["-np", "2", "python", "x.py"], {f"OMPI_MCA_{SHM_DIR_PARAM}": "/mine"}),  # the user's
    (["-np", "8", "python", "x.py"], {"SLURM_JOB_ID": "42"}),  # mpiexec may use other nodes
    (["-np", "2", "--mpi-args", "--host h1,h2", "python", "x.py"], {}),  # mpiexec's own option
    (["-np", "2", "--mpi-args=--hostfile=hosts", "python", "x.py"], {}),
    # a default hostfile in the environment, as a cluster's setup (or netcluster) sets
    (["-np", "8", "python", "x.py"], {"PRTE_MCA_prte_default_hostfile": "/run/hosts"}),
])
def test_no_directory_across_hosts_in_an_allocation_or_where_the_user_chose_one(argv, environ):
    assert job_shm_dir(parse_args(argv), environ) is None


@pytest.mark.parametrize("content,other_hosts", [
    ("# a comment only\n\n", False), ("# hosts\nnode1 slots=4\nnode2 slots=4\n", True)])
def test_a_default_hostfile_installed_beside_mpiexec_counts_when_it_names_hosts(
        tmp_path, content, other_hosts):
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "prte-default-hostfile").write_text(content)
    args = parse_args(["-np", "2", "python", "x.py"])
    assert may_use_other_hosts(args, {}, str(tmp_path / "bin" / "mpiexec")) is other_hosts


@needs_dev_shm
def test_a_single_host_job_gets_a_new_directory_each_time():
    args = parse_args(["-np", "2", "python", "x.py"])
    first, second = job_shm_dir(args, {}), job_shm_dir(args, {})
    try:
        assert first != second
        for made in (first, second):
            assert Path(made).parent == Path("/dev/shm") and Path(made).is_dir()
    finally:
        os.rmdir(first)
        os.rmdir(second)


RANK_SCRIPT = """
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allreduce(1) == comm.Get_size()
maps = [line.split()[-1] for line in open('/proc/self/maps') if 'sm_segment' in line]
print('SEGMENTS', comm.Get_rank(), sorted(set(maps)), flush=True)
comm.Barrier()
"""


@needs_dev_shm
def test_the_ranks_keep_their_segments_there_and_it_is_gone_after_the_job():
    result = run_launcher([sys.executable, "-m", "ripples.runner.launch", "-np", "2",
                           sys.executable, "-c", RANK_SCRIPT], timeout=120, env=mpi_env())
    assert result.returncode == 0, result.stdout + result.stderr
    segments = [line for line in result.stdout.splitlines() if line.startswith("SEGMENTS")]
    assert len(segments) == 2, result.stdout
    chosen = result.stderr.split(f"--mca {SHM_DIR_PARAM} ")[1].split()[0]
    assert chosen.startswith("/dev/shm/ripples-job-"), result.stderr
    for line in segments:  # the shared-memory transport mapped its files from there
        assert f"'{chosen}/sm_segment." in line, (chosen, line)
    assert not os.path.exists(chosen)
