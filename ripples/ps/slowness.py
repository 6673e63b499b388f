"""Slowness injection for parameter servers, as ``ripples.core.heterogeneity`` does for workers.

``RIPPLES_SERVER_SLOWDOWN="INDEX:FACTOR[,INDEX:FACTOR]"`` makes server ``INDEX`` (0-based
among the server ranks, spares included) ``FACTOR`` times slower. Once it is set, every
server emulates a service cost per message, ``fixed + per_byte * bytes`` (the request's
payload on arrival, the answer's on sending a pull), by sleeping ``factor`` times that cost
in its loop, so it serves nothing else meanwhile (a busy server is a queue).
``RIPPLES_SERVER_COST="FIXED_MS:NS_PER_BYTE"`` sets the cost (default ``"0.2:1"``: 0.2 ms per
message, 1 ns per byte, about 1 GB/s). The cost is emulated on every server, not just the
slowed ones, so that a factor of 3 means three times the others' service time whatever
the host's real speed.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Mapping, Optional

from ..core.heterogeneity import parse_slowdown

SLOWDOWN_ENV = "RIPPLES_SERVER_SLOWDOWN"
COST_ENV = "RIPPLES_SERVER_COST"
DEFAULT_COST = "0.2:1"


@dataclasses.dataclass(frozen=True)
class ServiceCost:
    """This server's emulated cost: ``factor * (fixed_s + per_byte_s * bytes)`` per message."""

    factor: float
    fixed_s: float
    per_byte_s: float

    def delay_s(self, nbytes: int) -> float:
        return self.factor * (self.fixed_s + self.per_byte_s * nbytes)

    def charge(self, nbytes: int) -> float:
        """Sleep for one message of ``nbytes``; return the time slept."""
        delay = self.delay_s(nbytes)
        if delay > 0:
            time.sleep(delay)
        return delay


def parse_cost(text: str) -> tuple:
    """``"FIXED_MS:NS_PER_BYTE"`` -> (fixed seconds, seconds per byte)."""
    fixed_text, sep, per_byte_text = text.strip().partition(":")
    try:
        fixed_ms, ns_per_byte = float(fixed_text), float(per_byte_text)
    except ValueError:
        raise ValueError(f"{COST_ENV}={text!r} is not FIXED_MS:NS_PER_BYTE (e.g. '0.2:1')") from None
    if not sep or fixed_ms < 0 or ns_per_byte < 0:
        raise ValueError(f"{COST_ENV}={text!r}: both numbers must be >= 0 (e.g. '0.2:1')")
    return fixed_ms / 1000, ns_per_byte / 1e9


def from_env(index: int, num_servers: int,
             environ: Optional[Mapping[str, str]] = None) -> Optional[ServiceCost]:
    """Server ``index``'s emulated cost, or None when neither setting is given. ``environ``
    maps the variable names to ``Config.server_slowdown`` and ``Config.server_cost``.

    Raises ValueError naming the variable for a malformed value or an index that is not a
    server (``0..num_servers - 1``)."""
    environ = {} if environ is None else environ
    spec, cost = environ.get(SLOWDOWN_ENV, ""), environ.get(COST_ENV, "")
    if not spec.strip() and not cost.strip():
        return None
    factors = parse_slowdown(spec, setting=SLOWDOWN_ENV)
    outside = sorted(i for i in factors if i >= num_servers)
    if outside:
        raise ValueError(f"{SLOWDOWN_ENV}={spec!r}: servers {outside} do not exist; this job "
                         f"has {num_servers} server ranks (indices 0..{num_servers - 1}, "
                         f"spares included)")
    fixed_s, per_byte_s = parse_cost(cost or DEFAULT_COST)
    return ServiceCost(factors.get(index, 1.0), fixed_s, per_byte_s)
