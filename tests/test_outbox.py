"""The outbox's bookkeeping (``ripples.comm.outbox``) with stand-in requests; the real
sends and collectives are in ``tests/mpi/mpi_outbox.py``."""
import gc
import weakref

import numpy as np
import pytest

from ripples.comm import outbox


class Request:
    """A stand-in for ``MPI.Request``: complete once ``done`` is set; counts its tests."""

    tests = 0

    def __init__(self, done=False):
        self.done = done

    def Test(self):
        Request.tests += 1
        return self.done


@pytest.fixture(autouse=True)
def empty_outbox(monkeypatch):
    monkeypatch.setattr(outbox, "_pending", [])
    monkeypatch.setattr(outbox, "_prune_at", outbox._MIN_PRUNE_AT)
    Request.tests = 0


def test_buffers_live_until_their_request_completes():
    request, buffer = Request(), np.zeros(4)
    alive = weakref.ref(buffer)
    outbox.keep_until_complete(request, buffers=(buffer,))
    del buffer
    for _ in range(2 * outbox._MIN_PRUNE_AT):  # looks at every kept request now and then
        outbox.keep_until_complete(Request(done=True))
    gc.collect()
    assert alive() is not None, "freed while MPI may still use it"
    request.done = True
    for _ in range(2 * outbox._MIN_PRUNE_AT):
        outbox.keep_until_complete(Request(done=True))
    gc.collect()
    assert alive() is None, "kept after its request completed"


def test_sends_that_never_complete_are_not_all_tested_at_every_call():
    stuck = [Request() for _ in range(100)]
    outbox.keep_until_complete(*stuck)
    for _ in range(100):
        outbox.keep_until_complete(Request(done=True))
    # Looking through everything at each call would test the 100 stuck ones 100 times.
    assert Request.tests < 1000, Request.tests
    assert all(any(kept is request for kept, _ in outbox._pending) for request in stuck)


def test_withdraw_cancels_each_receive_and_keeps_it_with_its_buffers():
    class Receive(Request):
        cancelled = False

        def Cancel(self):
            self.cancelled = True

    receives, buffer = [Receive(), Receive()], np.zeros(2)
    outbox.withdraw(*receives, buffers=(buffer,))
    assert all(r.cancelled for r in receives)
    assert [(kept, held) for kept, held in outbox._pending] == [(r, (buffer,)) for r in receives]


def test_release_completed_frees_the_buffers_of_completed_requests_only():
    done, pending = Request(done=True), Request()
    done_buffer, pending_buffer = np.zeros(2), np.zeros(2)
    freed = weakref.ref(done_buffer)
    outbox.keep_until_complete(done, buffers=(done_buffer,))
    outbox.keep_until_complete(pending, buffers=(pending_buffer,))
    del done_buffer
    outbox.release_completed()
    gc.collect()
    assert freed() is None
    assert [kept for kept, _ in outbox._pending] == [pending]
