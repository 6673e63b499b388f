"""Failures arrive as clear errors within the timeout, on the ranks that wait.

Scenarios (run by mpi_ps_scenarios.py, 3 ranks):
  ``silent server``   before PS mode: rank 0 makes a PS context but never serves; the
                      workers time out on it, and on their goodbye
  ``silent worker``   1 server; worker 1 goes silent: BSP fails naming it, ASP carries on
                      without it (last in its job: its sessions are left broken)
"""
import time

import torch
from mpi4py import MPI

from mpi_ps_common import ExplodingSGD, begin, check
from ripples.core.errors import RipplesError, RipplesTimeoutError
from ripples.ps.context import make_context
from ripples.ps.optimizer import PSOptimizer

TIMEOUT = 1.5


def vector(context, policy):
    param = torch.nn.Parameter(torch.zeros(4))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context, policy=policy,
                     timeout_s=TIMEOUT)
    param.grad = torch.ones(4)
    return ps


def silent_server():
    if MPI.COMM_WORLD.Get_rank() == 0:
        make_context(MPI.COMM_WORLD, 1, TIMEOUT)  # the collective part of start(), no serving
        MPI.COMM_WORLD.Barrier()
        return
    context, worker, _ = begin(1, timeout_s=TIMEOUT)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # pay torch's lazy imports
    context.worker_comm.Barrier()
    began = time.monotonic()
    try:
        vector(context, "asp")
        check(False, "a silent server must make the initial pull fail")
    except RipplesTimeoutError as exc:
        waited = time.monotonic() - began
        check("parameter server 0" in str(exc), f"error must name the server: {exc}")
        check(waited < 2 * TIMEOUT + 2, f"error after {waited:.1f} s")
    try:  # nor does it answer the goodbye: the worker must not leave as if all went well
        context.shutdown()
        check(False, "saying goodbye to a silent server must fail")
    except RipplesTimeoutError as exc:
        check("parameter server 0" in str(exc) and "goodbye" in str(exc),
              f"error must name the server and the goodbye: {exc}")
    MPI.COMM_WORLD.Barrier()
    if worker == 0:
        print("silent server OK", flush=True)


def silent_worker(context):
    worker = context.worker
    server_side_error_reaches_workers(context)
    ps = vector(context, "bsp")
    for _ in range(2):
        ps.step()
    if worker == 1:
        time.sleep(2 * TIMEOUT + 1)
    else:
        began = time.monotonic()
        try:
            ps.step()
            check(False, "BSP must fail when a worker stops pushing")
        except RipplesError as exc:
            waited = time.monotonic() - began
            check("workers [1]" in str(exc), f"error must name worker 1: {exc}")
            check(waited < TIMEOUT + 1.5, f"BSP error after {waited:.1f} s")

    ps = vector(context, "asp")
    steps = 5 if worker == 0 else 1
    for _ in range(steps):
        ps.step()
    if worker == 1:
        time.sleep(TIMEOUT + 1.5)
    ps.join()
    metrics = ps.metrics()
    if worker == 0:
        check(metrics["server_load"][0]["dead"] == [1], f"ASP must log worker 1: {metrics}")
        check(metrics["server_load"][0]["updates"] == 6, "ASP applied both workers' pushes")
        print("silent worker OK", flush=True)


def server_side_error_reaches_workers(context):
    param = torch.nn.Parameter(torch.zeros(4))
    ps = PSOptimizer(ExplodingSGD([param], lr=1.0), [("v", param)], context, policy="asp",
                     timeout_s=TIMEOUT)
    param.grad = torch.ones(4)
    try:
        ps.step()
        check(False, "an optimizer failing on the server must fail the worker's step")
    except RipplesError as exc:
        check("optimizer step exploded" in str(exc), f"error must carry the cause: {exc}")


BEFORE_PS = {"silent server": silent_server}
SCENARIOS = {"silent worker": silent_worker}
