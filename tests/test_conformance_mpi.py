"""The conformance modules that need nothing but ``hvd.init()`` and the default settings,
run together: one MPI job per world size instead of one per module and size.

Each rank of a job starts Python, torch and (with the first optimizer) torch's compiler
stack once, about 5 s of CPU; one job per module and size spent most of these modules' CPU
on that. Modules that need other settings (timeouts, bucket sizes, init() arguments) keep
jobs of their own. The schedule module comes first: it checks that no generator thread is
left, which a later module's optimizer could otherwise leave running until it is closed.
"""
import pytest

from mpi_launch import run_pytest_under_mpi

SCHEDULES = "mpi_schedule_service.py"  # Schedules and the Group Generator service
FLAT = "mpi_flat_parameters.py"  # flat parameter buffers and their views
PATTERNS = "mpi_training_patterns.py"  # epoch loops, evaluation, schedulers, AMP, ...
SAMPLER = "mpi_sampler.py"  # the shared DistributedSampler
BATCH_NORM = "mpi_sync_batch_norm.py"  # SyncBatchNorm
OPTIMIZER = "mpi_optimizer.py"  # DistributedOptimizer's modes
AUTOGRAD = "mpi_autograd.py"  # gradients of the collectives
NATIVE_LANE = "native_lane.py"  # the native steady-state lane (tests/test_native_lane.py
# runs it with the lane off as well)
ADPSGD = "mpi_adpsgd_async.py"  # asynchronous AD-PSGD: 3 ranks make two actives share a passive

MODULES = {
    1: [SAMPLER, BATCH_NORM, OPTIMIZER, AUTOGRAD, ADPSGD],
    2: [SCHEDULES, NATIVE_LANE, FLAT, PATTERNS, SAMPLER, BATCH_NORM, AUTOGRAD, ADPSGD],
    3: [NATIVE_LANE, FLAT, ADPSGD],
    4: [SCHEDULES, PATTERNS, SAMPLER, BATCH_NORM, OPTIMIZER, AUTOGRAD],
}


@pytest.mark.parametrize("nprocs", sorted(MODULES))
def test_conformance_modules(nprocs):
    run_pytest_under_mpi(MODULES[nprocs], nprocs, timeout=900)
