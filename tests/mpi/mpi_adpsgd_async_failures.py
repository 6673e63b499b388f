"""Asynchronous AD-PSGD with a peer that stops answering: 2 ranks (0 active, 1 passive),
run with a short ``RIPPLES_TIMEOUT_S``. The waiting rank gets ``RipplesTimeoutError``
naming the silent rank within the timeout, and both ranks close afterwards."""
import time

import pytest
import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples.core.errors import RipplesTimeoutError
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
TIMEOUT = current().config.timeout_s
assert N == 2 and TIMEOUT <= 5, "run with 2 ranks and a short RIPPLES_TIMEOUT_S"


@pytest.fixture(autouse=True)
def start_together():
    """Each test starts on both ranks at once: under load one rank's start-up (imports, test
    collection) can lag the other's by more than the short timeout, which would time out the
    first collective instead of the silence each test makes on purpose."""
    MPI.COMM_WORLD.Barrier()


def wrap():
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sync="adpsgd")
    return model, opt


def step(model, opt):
    opt.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()


def test_an_active_rank_names_a_passive_rank_that_never_answers():
    model, opt = wrap()
    if R == 0:
        began = time.monotonic()
        with pytest.raises(RipplesTimeoutError, match="passive rank 1"):
            step(model, opt)
        assert time.monotonic() - began < TIMEOUT + 3
    else:
        time.sleep(TIMEOUT + 1.5)  # stuck: never steps, so never starts answering
    opt.close()  # the passive then answers the stale request and the end notice
    MPI.COMM_WORLD.Barrier()


def test_a_passive_rank_names_an_active_rank_that_never_ends():
    model, opt = wrap()
    if R == 1:
        step(model, opt)
        began = time.monotonic()
        with pytest.raises(RipplesTimeoutError, match=r"active rank\(s\) \[0\]"):
            hvd.join()
        assert time.monotonic() - began < TIMEOUT + 3
    else:
        time.sleep(TIMEOUT + 1.5)  # stuck: neither steps nor joins
    opt.close()
    MPI.COMM_WORLD.Barrier()
