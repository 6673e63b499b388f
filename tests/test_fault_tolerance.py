"""Surviving dead ranks (``Config.fault_tolerant`` under Open MPI's ULFM): the survivors
shrink the world and finish training, in decentralized mode with their own models and in
all-reduce mode through ``hvd.elastic.run``, rolled back to the last commit."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

from mpi_launch import TESTS_DIR, mpi_env, run_mpi
from ripples.comm import failures
from ripples.core.errors import RanksFailedError
from ripples.runner.job_process import _descendants
from ripples.runtime import _recoverable_failure

SCRIPT = str(TESTS_DIR / "mpi" / "ft_training.py")
STEPS = 30

# The 8-rank case and the static schedule take half a minute each: long runs.
long_run = pytest.mark.skipif(not os.environ.get("RIPPLES_LONG_TESTS"),
                              reason="RIPPLES_LONG_TESTS=1: a long run")


def train_through_a_death(nprocs, mode, schedule, dead_rank, die_at, timeout=240,
                          env=()):
    result = run_mpi([sys.executable, SCRIPT, mode, schedule, str(dead_rank), str(die_at),
                      str(STEPS)], nprocs, timeout=timeout, check=False,
                     env={"RIPPLES_FAULT_TOLERANT": "1", **dict(env)},
                     mpiexec_args=list(failures.MPIEXEC_ARGS))
    survivors = [dict(re.findall(r"(\w+)=(\S+)", line))
                 for line in result.stdout.splitlines() if line.startswith("SURVIVOR")]
    return result, survivors


def check_survivors(result, survivors, nprocs, dead_rank, resets):
    assert len(survivors) == nprocs - 1, result.stdout
    assert sorted(int(s["old_rank"]) for s in survivors) == [
        r for r in range(nprocs) if r != dead_rank], result.stdout
    # renumbered in their old order, on a world one smaller
    for s in survivors:
        old = int(s["old_rank"])
        assert int(s["rank"]) == old - (old > dead_rank), result.stdout
        assert int(s["size"]) == nprocs - 1
        assert s["resets"] == resets, result.stdout
        assert int(s["steps"]) == STEPS
        assert float(s["loss"]) < float(s["loss0"]) / 10, result.stdout


@long_run
def test_decentralized_survivors_finish_when_rank_5_of_8_dies():
    result, survivors = train_through_a_death(8, "decentralized", "generator", 5, 10)
    check_survivors(result, survivors, 8, 5, "7")
    assert "rank(s) [5] of the 8-rank world died" in result.stdout


@pytest.mark.parametrize("schedule,dead_rank", [
    ("generator", 0), ("random", 3), pytest.param("static", 2, marks=long_run)])
def test_decentralized_survivors_finish_whichever_rank_dies(schedule, dead_rank):
    # Rank 0 hosts the group generator: the survivors elect the new rank 0's. With the
    # random schedule the survivors learn of the death in different steps and must agree
    # where the new schedule starts (a rank one step off would wait for good at the end).
    result, survivors = train_through_a_death(4, "decentralized", schedule, dead_rank, 10)
    check_survivors(result, survivors, 4, dead_rank, "3")
    assert "Traceback" not in result.stdout, result.stdout  # no survivor failed, at exit either


def test_a_rank_raising_leaves_as_a_dead_rank_and_the_survivors_finish():
    # Fault tolerant, an uncaught exception ends its rank alone (no MPI_Abort).
    result, survivors = train_through_a_death(4, "decentralized", "generator", 2, 10,
                                              env={"FT_TRAINING_RAISE": "1"})
    check_survivors(result, survivors, 4, 2, "3")
    assert result.stdout.count("RuntimeError: an error in the training script on rank 2") == 1
    assert "rank 2 raised an uncaught RuntimeError and leaves the job as a dead rank" in \
        result.stdout, result.stdout


def test_ripplesrun_exits_0_when_the_survivors_finish_without_a_rank_that_raised():
    """Fault tolerant, the job's result is the survivors': rank 2 raises and leaves (its
    status is 1), the two others finish, and ripplesrun says whom they finished without
    and exits 0, as it does after leaving a silent rank behind."""
    ripplesrun = str(Path(sys.executable).parent / "ripplesrun")
    job = subprocess.run([ripplesrun, "-np", "3", "--fault-tolerant", sys.executable, SCRIPT,
                          "decentralized", "generator", "2", "10", str(STEPS)],
                         capture_output=True, text=True, timeout=180,
                         env=mpi_env({"FT_TRAINING_RAISE": "1"}))
    out = job.stdout + job.stderr
    assert len([line for line in job.stdout.splitlines() if line.startswith("SURVIVOR")]) == 2
    assert "the survivors finished without rank(s) [2] of the 3-rank world" in out, out
    assert "which may still run" not in out, out  # it left: nobody is left behind
    assert job.returncode == 0, out


@pytest.mark.parametrize("schedule", ["generator", pytest.param("adpsgd", marks=long_run)])
def test_a_rank_dying_during_average_model_leaves_one_model_on_the_survivors(schedule):
    # The first collective of the whole world after a death is often the epoch's
    # average_model: the survivors average among themselves instead of raising.
    result, survivors = train_through_a_death(4, "decentralized", schedule, 2, STEPS)
    check_survivors(result, survivors, 4, 2, "3")
    assert len({s["checksum"] for s in survivors}) == 1, result.stdout
    assert "Traceback" not in result.stdout, result.stdout


@pytest.mark.parametrize("dead_rank", [1, 2])  # a passive rank, an active rank
def test_asynchronous_adpsgd_survivors_keep_their_roles_and_finish(dead_rank):
    result, survivors = train_through_a_death(4, "decentralized", "adpsgd", dead_rank, 10)
    check_survivors(result, survivors, 4, dead_rank, "3")
    # Every survivor keeps its role (even old ranks active): a passive rank already in
    # join() that turned active would be averaged no more, its model left behind.
    assert all(s["active"] == str(int(s["old_rank"]) % 2 == 0) for s in survivors), \
        result.stdout
    assert "Traceback" not in result.stdout, result.stdout


def test_parameter_servers_go_on_without_a_dead_worker():
    """1 server and 3 workers, BSP; worker 1 dies before its step 10. The server drops it
    and closes the later rounds with the other two: their model is that of one process
    averaging 3 gradients per step up to step 9 and 2 from step 10 on."""
    result, survivors = train_through_a_death(4, "ps", "bsp", 1, 10,
                                              env={"RIPPLES_PS_SERVERS": "1"})
    assert sorted(int(s["old_rank"]) for s in survivors) == [0, 2], result.stdout
    for s in survivors:
        assert int(s["steps"]) == STEPS and float(s["loss"]) < float(s["loss0"]) / 10, s
    assert "worker 1 (rank 2) died; going on without it" in result.stdout, result.stdout
    assert re.findall(r"PS_SERVER rank=\d dead=(\S*)", result.stdout) == ["1", "1"]
    twins = re.findall(r"TWIN rank=\d max_difference=(\S+)", result.stdout)
    assert len(twins) == 2 and all(float(gap) < 1e-5 for gap in twins), result.stdout
    assert "Traceback" not in result.stdout, result.stdout


def test_elastic_all_reduce_rolls_back_to_the_last_commit_and_goes_on():
    result, survivors = train_through_a_death(4, "elastic", "-", 2, 12)
    # the global callback (new size), then TorchState's reset callback
    check_survivors(result, survivors, 4, 2, "3,-1")
    # a process set of the first world is refused, one added again works
    outcomes = sorted(re.findall(r"PROCESS_SET rank=(\d) outcome=(\S+)", result.stdout))
    assert outcomes == [("0", "refused,sum=2"), ("1", "refused,sum=2"), ("2", "refused")], \
        result.stdout
    twins = re.findall(r"TWIN rank=\d max_difference=(\S+)", result.stdout)
    assert len(twins) == 3, result.stdout
    # equal to one process averaging all 4 ranks' gradients up to the commit at step 10,
    # and the 3 survivors' from there (the steps 10 and 11 done before the death are redone)
    assert all(float(gap) < 1e-5 for gap in twins), twins


def test_elastic_sampler_gives_every_sample_once_through_a_death():
    """4 ranks, batches of 2, commits every 2 batches; rank 2 dies at its batch 7, after
    the commit of batch 5: 48 samples were processed, 12 of them by rank 2 (its share
    2, 6, 10, ...). The survivors redo batch 6 and share the other 48 samples."""
    result, survivors = train_through_a_death(4, "sampler", "-", 2, 7)
    assert sorted(int(s["old_rank"]) for s in survivors) == [0, 1, 3], result.stdout
    dead_rank_committed = list(range(2, 96, 4))[:12]
    for trained in re.findall(r"SAMPLES rank=\d trained=(\[.*\])", result.stdout):
        # exactly once: the survivors' committed samples and the dead rank's
        assert sorted(json.loads(trained) + dead_rank_committed) == list(range(96)), trained
    assert len(re.findall("SAMPLES", result.stdout)) == 3, result.stdout


@pytest.mark.parametrize("dead_rank", [2, 0])  # a drawing rank, the pool's keeper
def test_a_shared_epoch_goes_on_when_a_rank_dies_holding_a_chunk(dead_rank):
    """4 ranks draw 120 samples in chunks of 4; rank DEAD dies in its third chunk. The
    survivors finish the epoch: nothing is trained twice, and nothing is missing but the
    unfinished chunk, and that only with a warning naming it. When rank 0, which keeps the
    pool, dies, nothing is missing at all: whatever no survivor drew is handed out again
    (the dead rank's finished chunks, and one rank 0 was handing out as it died). The next
    epoch, on 3 ranks, is whole."""
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "ft_shared_sampler.py"),
                      str(dead_rank)], 4, timeout=180, check=False,
                     env={"RIPPLES_FAULT_TOLERANT": "1", "RIPPLES_TIMEOUT_S": "10"},
                     mpiexec_args=list(failures.MPIEXEC_ARGS))
    (dead,) = re.findall(r"DEAD finished=(\[.*\]) held=\[(\d+), (\d+)\]", result.stdout)
    finished, held = json.loads(dead[0]), range(int(dead[1]), int(dead[2]))
    trained = {(int(o), int(e)): json.loads(i) for o, e, i in re.findall(
        r"TRAINED old_rank=(\d) epoch=(\d) indices=(\[.*\])", result.stdout)}
    survivors = sorted({o for o, _ in trained})
    assert survivors == [r for r in range(4) if r != dead_rank], result.stdout
    first = [i for o in survivors for i in trained[o, 0]]
    assert sorted(first) == sorted(set(first)), result.stdout  # no survivor trained one twice
    order = torch.randperm(120, generator=torch.Generator().manual_seed(2)).tolist()
    missing = set(range(120)) - set(first) - set(finished)
    if dead_rank == 0:
        assert not missing, result.stdout
        assert re.search(r"The positions no survivor drew are handed out again, first those "
                         r"before it, \[(\(\d+, \d+\)(, )?)*\]", result.stdout)
    else:  # the keeper lived: what the dead rank finished is not redone
        assert missing <= {order[p] for p in held}, result.stdout  # its unfinished chunk
        assert not set(first) & set(finished), result.stdout
    if missing:
        assert re.search(r"chunks \[\(\d+, \d+\)\] of pass 1, held by ranks that died, came "
                         r"back after every rank had finished that pass: they were skipped",
                         result.stdout)
    assert sorted(i for o in survivors for i in trained[o, 1]) == list(range(120))


@pytest.mark.parametrize("mode,schedule,frozen_rank", [
    ("elastic", "allreduce", 2),
    ("decentralized", "adpsgd", 1)])  # a passive: the active ranks' exchanges time out
def test_a_frozen_rank_is_left_behind_and_stops_when_it_thaws(mode, schedule, frozen_rank):
    """A rank of 4 freezes (SIGSTOP) at step 12: alive to MPI, so no process failure is ever
    reported. The liveness check finds it silent; the other three agree to go on without
    it and finish (elastic all-reduce: rolled back to the last commit, the model of one
    process averaging 4 gradients up to step 9 and 3 after). Thawed once they are done,
    the frozen rank fails in its next collective and stops; ripplesrun ends the job
    (mpiexec would wait for a rank still frozen), with status 0: the survivors finished."""
    ripplesrun = str(Path(sys.executable).parent / "ripplesrun")
    command = [ripplesrun, "-np", "4", "--fault-tolerant", "--timeout", "5", sys.executable,
               SCRIPT, mode, schedule, str(frozen_rank), "12", str(STEPS)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env={**os.environ, "FT_TRAINING_FREEZE": "1"})
    lines, frozen = [], None
    try:
        for line in job.stdout:
            lines.append(line)
            if frozen is None and sum(x.startswith("SURVIVOR") for x in lines) == 3:
                frozen = [pid for pid in _descendants(job.pid) if _state(pid) == "T"]
                assert len(frozen) == 1, "".join(lines)
                os.kill(frozen[0], signal.SIGCONT)
        job.wait(timeout=60)
    finally:
        job.kill()
    out = "".join(lines)
    survivors = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in lines
                 if line.startswith("SURVIVOR")]
    others = [r for r in range(4) if r != frozen_rank]
    assert sorted(int(s["old_rank"]) for s in survivors) == others, out
    assert all(s["size"] == "3" and int(s["steps"]) == STEPS for s in survivors), out
    if mode == "elastic":
        twins = re.findall(r"TWIN rank=\d max_difference=(\S+)", out)
        assert len(twins) == 3 and all(float(gap) < 1e-5 for gap in twins), out
    else:
        assert all(float(s["loss"]) < float(s["loss0"]) / 10 for s in survivors), out
    assert f"rank(s) [{frozen_rank}] of the 4-rank world did not answer (frozen" in out, out
    # thawed, it never trains on: its next collective fails (the others are gone)
    assert f"WOKE old_rank={frozen_rank}" in out, out
    assert f"old_rank={frozen_rank} size" not in out, out
    assert f"the survivors finished without rank(s) [{frozen_rank}]" in out, out
    assert job.returncode == 0, out
    assert _state(frozen[0]) in ("", "Z"), out  # ended, not left running


def test_a_job_ends_when_every_rank_the_survivors_reach_raises_with_one_left_behind():
    """Rank 2 of 3 freezes; ranks 0 and 1 leave it behind, and then each raises the
    ``HorovodInternalError`` that its script does not catch, leaving the job as a dead rank.
    Nobody can finish: the job ends with status 1, naming who left and who was left
    behind (across hosts mpiexec would wait for the silent rank for good: ripplesrun
    stops it 10 s later)."""
    ripplesrun = str(Path(sys.executable).parent / "ripplesrun")
    script = str(TESTS_DIR / "mpi" / "across_hosts.py")  # raises, without a checkpoint path
    job = subprocess.Popen([ripplesrun, "-np", "3", "--fault-tolerant", "--timeout", "3",
                            sys.executable, script, "60"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, frozen_at, frozen = [], None, None
    try:
        for line in job.stdout:
            lines.append(line)
            if frozen is None and sum(x.startswith("READY") for x in lines) == 3:
                frozen = int(re.search(r"^READY 2 sum=3 .*pid=(\d+)$", "".join(lines),
                                       re.M).group(1))
                # past the loop's first all-reduces, which make the native lane's
                # communicator: a rank lost while one is made ends the job another way
                time.sleep(1.0)
                os.kill(frozen, signal.SIGSTOP)
                frozen_at = time.time()
        job.wait(timeout=90)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        if frozen is not None and _state(frozen) == "T":
            os.kill(frozen, signal.SIGKILL)
    out = "".join(lines)
    took = time.time() - frozen_at
    assert job.returncode == 1, out
    assert "left behind, silent: launch rank(s) [2]" in out, out
    # on one host mpiexec ends by itself (rank 2 lives on, frozen); across hosts it waits
    # for the silent rank, and ripplesrun stops it
    assert ("every rank the survivors could reach left the job with an uncaught error "
            "(launch rank(s) [0, 1]); rank(s) [2] were left behind") in out, out
    assert took < 3 + 5 + 10 + 15, (took, out)
    assert _state(frozen) in ("", "Z"), out  # ripplesrun ended it


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_fault_tolerant_without_ulfm_is_refused_on_every_rank():
    code = ("import ripples.torch as hvd\n"
            "try:\n    hvd.init()\n"
            "except ValueError as e:\n    print('REFUSED', e, flush=True)\n")
    result = run_mpi([sys.executable, "-c", code], 2, timeout=60,
                     env={"RIPPLES_FAULT_TOLERANT": "1"})
    refusals = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refusals) == 2, result.stdout
    assert "ripplesrun --fault-tolerant" in refusals[0] and "--with-ft ulfm" in refusals[0]


def test_process_failures_are_told_from_other_errors():
    assert failures.is_process_failure(MPI.Exception(MPI.ERR_PROC_FAILED))
    assert failures.is_process_failure(MPI.Exception(MPI.ERR_REVOKED))
    assert not failures.is_process_failure(MPI.Exception(MPI.ERR_TRUNCATE))
    assert not failures.is_process_failure(ValueError("x"))
    # through an error raised from one
    try:
        try:
            raise MPI.Exception(MPI.ERR_PROC_FAILED_PENDING)
        except MPI.Exception as exc:
            raise RuntimeError("the generator did not answer") from exc
    except RuntimeError as wrapped:
        assert _recoverable_failure(wrapped)
    assert not _recoverable_failure(RuntimeError("plain"))


def test_ulfm_is_on_only_when_mpiexec_enabled_it():
    assert failures.ulfm_active({"OMPI_MCA_mpi_ft_enable": "1"})
    assert not failures.ulfm_active({})
    assert not failures.ulfm_active({"OMPI_MCA_mpi_ft_enable": "0"})


def test_a_launch_without_the_transport_or_finalize_settings_is_named():
    assert failures.missing_launch_settings({}) == [
        "--mca btl tcp,self", "--mca async_mpi_finalize 1"]
    assert failures.missing_launch_settings({"OMPI_MCA_btl": "tcp,self"}) == [
        "--mca async_mpi_finalize 1"]
    assert failures.missing_launch_settings(
        {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_async_mpi_finalize": "1"}) == []


def test_ranks_failed_error_is_horovods_internal_error():
    import ripples.torch as hvd
    assert hvd.HorovodInternalError is RanksFailedError
    assert hvd.elastic.HorovodInternalError is RanksFailedError
    error = RanksFailedError("x", failed=[5], size=7, rank=3, generation=1)
    assert (error.failed, error.size, error.rank, error.generation) == ((5,), 7, 3, 1)


def test_elastic_sampler_shares_what_is_left_among_the_current_world(monkeypatch):
    import types

    import ripples.runtime as runtime
    from ripples.torch.elastic import ElasticSampler
    world = types.SimpleNamespace(rank=0, size=3)
    monkeypatch.setattr(runtime, "current", lambda: world)
    samplers = []
    for rank in range(3):
        world.rank = rank
        samplers.append(ElasticSampler(range(12), shuffle=False))
    assert [list(s) for s in samplers] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    samplers[0].record_batch(0, 2)  # rank 0 processed samples 0 and 3
    samplers[1].record_batch(0, 2)  # rank 1: 1 and 4
    # rank 2 died; the survivors merge what was processed and split the other 8 samples
    processed = sorted(samplers[0].processed_indices | samplers[1].processed_indices)
    world.size = 2
    left = []
    for rank in range(2):
        world.rank = rank
        samplers[rank].load_state_dict({"epoch": 0, "processed_indices": processed})
        left.append(list(samplers[rank]))
    assert sorted(left[0] + left[1]) == [2, 5, 6, 7, 8, 9, 10, 11]
    assert len(samplers[0]) == len(samplers[1]) == 4
    samplers[0].set_epoch(1)  # a new epoch starts from every sample
    assert len(samplers[0]) == 6
