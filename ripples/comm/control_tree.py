"""The fixed-size first half of a control round: have all members the same collectives pending?

Every member of a group sends one record of ``FIELDS`` int64 (128 bytes, whatever the group
size) up a tree of fan-out ``FANOUT`` over the group's members (the lowest rank is the
root): a digest of its pending collectives (names, signatures), the group's hash, a flag
asking for the full round (a member without the group's communicator, or one that has
joined), and the time it posted. Each inner node combines its children's records with its
own into one record of the same size and sends it up; the root decides and the decision
travels back down. So a round costs O(log P) messages in sequence and each rank handles at
most ``FANOUT + 1`` records, where a star on the lowest rank handled 2(P-1).

The root answers ``unanimous`` (every member runs everything it has pending, in order)
only when all digests match, nobody asked for the full round, and the records were posted
within half the timeout of each other. Anything else sends the members to the full round
(``ripples.comm.control``), which names the differences.

Timeouts and stale messages. Each record carries its sender's attempt number, unique per
process, and a decision sent down echoes the attempt it answers, so a member never acts on
an answer meant for an attempt it gave up. A member that gives up waiting for its parent
sends it a withdrawal of that attempt; a node that gives up waiting for its children sends
its parent a failure naming the missing ranks (a fixed list of the first few, and the
count) and sends its waiting children the same error, so every rank that arrived raises
the same message. A failure that happened before a node even posted belongs to a round the
node never took part in and is ignored. The time spread check closes the last gap: a
member only gives up after 1.5 times the timeout, so a record that old is never part of a
unanimous decision. Clocks of different hosts are compared, so the spread check assumes
they agree to well within half the timeout.
"""
from __future__ import annotations

import itertools
import time
import zlib
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ripples.comm.mpi import Deadline, poll_until
from ripples.errors import RipplesTimeoutError

FANOUT = 16
FIELDS = 16
MAX_NAMED = FIELDS - 8  # missing ranks a failure names; the count says how many in all

_TAG_UP = 13
_TAG_DOWN = 14

# Field 0: the kind of message. Up the tree:
_UP, _FAILED, _WITHDRAW = 1, 2, 3
# down the tree:
_UNANIMOUS, _FULL_ROUND, _ERROR = 4, 5, 6
# Fields: 1 attempt (a decision: the receiver's, echoed), 2 group hash, 3 digest (a
# decision: the root rank), 4 flags, 5 earliest post time (ms), 6 latest post time (ms),
# 7 missing count, 8.. the first missing ranks.
_KIND, _ATTEMPT, _GROUP, _DIGEST, _FLAGS, _T_MIN, _T_MAX, _N_MISSING = range(8)
_ROOT = _DIGEST

# Flags
WANTS_FULL_ROUND = 1
_DIFFERENT = 2  # a member's digest differs from its parent's
_FOREIGN = 4    # a member sent a record of another group (it runs a different collective)

_attempts = itertools.count(1)


class Verdict(NamedTuple):
    """The decision for this member: ``unanimous``, or the full round led by ``leader``
    (the root of the group that decided; another group's root when this rank is in a
    collective the other members are not)."""

    unanimous: bool
    leader: int


def digest(entries: Sequence) -> int:
    """A 62-bit digest of a member's pending entries (their ``repr`` must be equal on every
    member that has the same collectives pending)."""
    text = repr(tuple(entries)).encode()
    return (zlib.crc32(text) << 30) ^ zlib.adler32(text)


def group_hash(group: Sequence[int]) -> int:
    """A 32-bit hash naming ``group``."""
    return zlib.crc32(repr(tuple(group)).encode())


def tree_parent(index: int) -> Optional[int]:
    """The index (in the sorted group) of the parent of member ``index``; None for the root."""
    return (index - 1) // FANOUT if index else None


def tree_children(index: int, size: int) -> range:
    """The indices of the children of member ``index`` in a group of ``size``."""
    first = FANOUT * index + 1
    return range(min(first, size), min(first + FANOUT, size))


def _depth(index: int) -> int:
    """Levels above member ``index`` (0 for the root)."""
    depth = 0
    while index:
        index = (index - 1) // FANOUT
        depth += 1
    return depth


def tree_height(index: int, size: int) -> int:
    """Levels below member ``index`` (0 for a leaf)."""
    height = 0
    first = index
    while FANOUT * first + 1 < size:
        first = FANOUT * first + 1
        height += 1
    return height


def agree(ctl: MPI.Comm, group: Sequence[int], entries_digest: int, wants_full_round: bool,
          what: str, timeout_s: float, stall_s: float,
          idle: Optional[Callable[[], bool]] = None) -> Verdict:
    """Run the fixed-size round for this member of ``group`` (world ranks, sorted, on
    ``ctl``). Raises ``RipplesTimeoutError`` naming missing members when some never
    arrive within the timeout, on every member that did. ``idle``: see ``poll_until``."""
    group = tuple(group)
    rank = ctl.Get_rank()
    index = group.index(rank)
    size = len(group)
    attempt = next_attempt()
    hashed = group_hash(group)
    posted = _now_ms()
    mine = _message(_UP, attempt, hashed, entries_digest,
                    WANTS_FULL_ROUND if wants_full_round else 0, posted, posted)
    children = [group[i] for i in tree_children(index, size)]
    parent = tree_parent(index)

    def describe_missing(missing: List[int], count: int) -> str:
        more = f" and {count - len(missing)} more" if count > len(missing) else ""
        return (f"{what} on group {_short(group)}: rank(s) {missing}{more} have not called "
                f"it (rank {rank} is waiting)")

    gather_s = _gather_s(timeout_s, tree_height(index, size))
    combined, delivered, failure = _gather(ctl, children, mine, posted, gather_s, stall_s,
                                           idle, describe_missing)
    if failure is not None:  # a subtree is incomplete: tell both ways, then raise
        missing, count = failure
        if parent is not None:
            _send(ctl, _failure(_FAILED, attempt, hashed, missing, count), group[parent],
                  _TAG_UP)
        _send_down(ctl, delivered, _failure(_ERROR, 0, hashed, missing, count))
        raise RipplesTimeoutError(f"{describe_missing(missing, count)}: gave up after "
                                  f"{gather_s:g} s (Config.timeout_s / RIPPLES_TIMEOUT_S)")
    if parent is None:
        decision = _decide(combined, timeout_s, group[0])
    else:
        _send(ctl, combined, group[parent], _TAG_UP)
        try:
            decision = _await_decision(ctl, group[parent], attempt, group, what, timeout_s,
                                       stall_s, idle, _depth(index))
        except RipplesTimeoutError:  # the members below learn it from here, not on their own
            _send_down(ctl, delivered, _failure(_ERROR, 0, hashed, [group[parent]], 1))
            raise
    _send_down(ctl, delivered, decision)
    if decision[_KIND] == _ERROR:
        missing, count = _missing_of(decision)
        raise RipplesTimeoutError(f"{describe_missing(missing, count)}: the group gave up "
                                  "(Config.timeout_s / RIPPLES_TIMEOUT_S)")
    if decision[_GROUP] != hashed:  # another group's round reached this rank
        return Verdict(False, int(decision[_ROOT]))
    return Verdict(decision[_KIND] == _UNANIMOUS, int(decision[_ROOT]))


def _gather(ctl, children, mine, posted, gather_s, stall_s, idle, describe_missing):
    """Collect one live record per child. Returns (combined record, {child: its attempt},
    None) or, when a subtree is incomplete, (None, delivered, (missing ranks, count))."""
    latest: Dict[int, Optional[np.ndarray]] = {child: None for child in children}
    failures: List[np.ndarray] = []
    buffer = _message(0, 0, 0, 0, 0, 0, 0)

    def receive() -> bool:
        for child in children:
            while ctl.Iprobe(source=child, tag=_TAG_UP):
                ctl.Recv([buffer, MPI.INT64_T], source=child, tag=_TAG_UP)
                kind = buffer[_KIND]
                if kind == _UP:
                    latest[child] = buffer.copy()
                elif latest[child] is not None and latest[child][_ATTEMPT] == buffer[_ATTEMPT]:
                    latest[child] = None  # withdrawn, or failed below
                if kind == _FAILED and buffer[_T_MAX] >= posted:
                    failures.append(buffer.copy())
        return bool(failures) or all(m is not None for m in latest.values())

    def describe() -> str:
        return describe_missing([c for c, m in latest.items() if m is None][:MAX_NAMED],
                                sum(m is None for m in latest.values()))

    try:
        poll_until(receive, Deadline(gather_s, stall_s, describe), idle)
    except RipplesTimeoutError:
        absent = [c for c, m in latest.items() if m is None]
        failures.append(_failure(_FAILED, 0, 0, absent[:MAX_NAMED], len(absent)))
    delivered = {c: int(m[_ATTEMPT]) for c, m in latest.items() if m is not None}
    if failures:
        return None, delivered, _merge_missing(failures)
    combined = mine.copy()
    for record in latest.values():
        if record[_GROUP] != mine[_GROUP]:
            combined[_FLAGS] |= _FOREIGN
        elif record[_DIGEST] != mine[_DIGEST]:
            combined[_FLAGS] |= _DIFFERENT
        combined[_FLAGS] |= record[_FLAGS]
        combined[_T_MIN] = min(combined[_T_MIN], record[_T_MIN])
        combined[_T_MAX] = max(combined[_T_MAX], record[_T_MAX])
    return combined, delivered, None


def _gather_s(timeout_s: float, height: int) -> float:
    """How long a node of ``height`` waits for its children: the timeout, and a quarter more
    per level of inner nodes below, so that an inner child that lacks a member of its own
    subtree gives up first and names it."""
    return timeout_s * (1 + 0.25 * max(0, height - 1))


def _decide(combined: np.ndarray, timeout_s: float, root: int) -> np.ndarray:
    spread_ms = combined[_T_MAX] - combined[_T_MIN]
    unanimous = combined[_FLAGS] == 0 and spread_ms < 500 * timeout_s
    return _message(_UNANIMOUS if unanimous else _FULL_ROUND, 0, combined[_GROUP], root, 0, 0,
                    0)


def _await_decision(ctl, parent, attempt, group, what, timeout_s, stall_s, idle,
                    depth: int) -> np.ndarray:
    buffer = _message(0, 0, 0, 0, 0, 0, 0)
    rank = ctl.Get_rank()

    def answered() -> bool:
        while ctl.Iprobe(source=parent, tag=_TAG_DOWN):
            ctl.Recv([buffer, MPI.INT64_T], source=parent, tag=_TAG_DOWN)
            if buffer[_ATTEMPT] == attempt:
                return True
        return False  # nothing yet, or only answers to attempts this rank gave up

    # The root answers within its own timeout, naming whoever is missing; a member gives up
    # later, so that it only times out on its own when its parent is absent, and deeper
    # members later still, so that they hear it from the member above when that one gives up.
    wait_s = (_gather_s(timeout_s, tree_height(0, len(group))) + max(1.0, 0.5 * timeout_s)
              + 0.5 * (depth - 1))
    deadline = Deadline(wait_s, stall_s, lambda: (
        f"{what} on group {_short(group)}: rank {parent} (the member this rank reports to) "
        f"has not answered (rank {rank} is waiting)"))
    try:
        poll_until(answered, deadline, idle)
    except RipplesTimeoutError:
        _send(ctl, _message(_WITHDRAW, attempt, group_hash(group), 0, 0, _now_ms(), _now_ms()),
              parent, _TAG_UP)
        raise
    return buffer.copy()


def _send_down(ctl, delivered: Dict[int, int], decision: np.ndarray) -> None:
    for child, attempt in delivered.items():
        message = decision.copy()
        message[_ATTEMPT] = attempt
        _send(ctl, message, child, _TAG_DOWN)


def _message(kind, attempt, group, digest_or_root, flags, t_min, t_max) -> np.ndarray:
    message = np.zeros(FIELDS, dtype=np.int64)
    message[:7] = (kind, attempt, group, digest_or_root, flags, t_min, t_max)
    return message


def _failure(kind, attempt, group, missing: Sequence[int], count: int) -> np.ndarray:
    now = _now_ms()
    message = _message(kind, attempt, group, 0, 0, now, now)
    message[_N_MISSING] = count
    named = list(missing)[:MAX_NAMED]
    message[8:8 + len(named)] = named
    return message


def _missing_of(message: np.ndarray):
    count = int(message[_N_MISSING])
    return [int(r) for r in message[8:8 + min(count, MAX_NAMED)]], count


def _merge_missing(failures: Sequence[np.ndarray]):
    missing: List[int] = []
    count = 0
    for failure in failures:
        named, n = _missing_of(failure)
        missing += named
        count += n
    return sorted(missing)[:MAX_NAMED], count


def next_attempt() -> int:
    """A fresh attempt number (unique in this process) for a record this rank sends."""
    return next(_attempts)


# Sends nobody waits for: each request (it holds its buffer) is kept until it completes.
_outbox: List[MPI.Request] = []


def keep_until_sent(request: MPI.Request) -> None:
    """Let ``request`` (a send) complete in the background."""
    _outbox[:] = [r for r in _outbox if not r.Test()]
    _outbox.append(request)


def _send(ctl, message: np.ndarray, dest: int, tag: int) -> None:
    keep_until_sent(ctl.Isend([message, MPI.INT64_T], dest=dest, tag=tag))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _short(group: Sequence[int]) -> str:
    """A group for messages: all of it when small, else its size and ends."""
    if len(group) <= 16:
        return str(tuple(group))
    return f"of {len(group)} ranks ({group[0]}..{group[-1]})"
