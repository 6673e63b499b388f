"""Requests that a control round could not run yet: waiting on, or failing after the timeout."""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence

from ripples.comm.control import Decision, missing_description
from ripples.core.errors import RipplesTimeoutError
from ripples.ops.request import Request


def expire(runtime, batch: List[Request], decision: Decision,
           fail_unmatched: Callable[[Sequence[Request], BaseException], None]) -> None:
    """Fail (through ``fail_unmatched``) the requests of ``batch`` that other members have
    not matched within ``Config.timeout_s``, unless the missing members are alive and busy
    (``Liveness.keep_waiting``): those are waited for afresh."""
    now = time.monotonic()
    timeout = runtime.config.timeout_s
    # One liveness question per set of missing members (a dead one takes seconds to tell).
    found: Dict[tuple, Optional[RipplesTimeoutError]] = {}
    for request in batch:
        request.missing = decision.missing.get(request.name, request.missing)
        if now - request.submitted <= timeout:
            continue
        error = RipplesTimeoutError(
            f"{request.what} {request.name!r} on group {request.group}: "
            f"{missing_description(request.missing)} within {timeout:g} s "
            f"(rank {runtime.rank} is waiting; Config.timeout_s / RIPPLES_TIMEOUT_S)",
            missing=request.missing or ())
        if error.missing not in found:
            try:  # members busy outside ripples may still call it
                runtime.liveness.keep_waiting(error.missing, error)
                found[error.missing] = None
            except RipplesTimeoutError as final:
                found[error.missing] = final
        failure = found[error.missing]
        if failure is None:
            request.submitted = time.monotonic()
        elif failure.finding:  # this request's own message, with what the check found
            fail_unmatched([request], RipplesTimeoutError(
                f"{error}; {failure.finding}", missing=error.missing))
        else:
            fail_unmatched([request], error)
