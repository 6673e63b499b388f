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
node never took part in and is ignored. So is a child's record posted longer ago than the
child waits for an answer (outside join rounds, where that wait restarts while the others
train): its sender has withdrawn it, and the withdrawal may be seen only after the record
(observed with Open MPI's shared memory: a withdrawal sent seconds earlier was not yet
visible to the probe that found the record before it). The time spread check closes the
last gap: a member only gives up after 1.5 times the timeout, so a record that old is
never part of a unanimous decision. Clocks of different hosts are compared, so the spread
check assumes they agree to well within half the timeout.
"""
from __future__ import annotations

import functools
import itertools
import struct
import time
import zlib
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

from mpi4py import MPI

from ripples.comm import outbox
from ripples.comm.mpi import Deadline, poll_until
from ripples.core.errors import RipplesTimeoutError

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
    """A 62-bit digest of a member's pending entries ``(name, signature, wire)``, in order:
    equal on members that have the same collectives pending in the same order."""
    value = len(entries)
    for name, signature, wire in entries:
        # The texts of a call shape repeat every step while unnamed collectives get a new
        # name each time: hash the texts once, then only the name on top of them.
        crc, adler = _texts_sums(signature, wire)
        text = name.encode()
        entry = (zlib.crc32(text, crc) << 30) ^ zlib.adler32(text, adler)
        value = (value * _MIX + entry) & _MASK
    return value


@functools.lru_cache(maxsize=4096)
def _texts_sums(signature: str, wire: str):
    text = f"{signature}\0{wire}\0".encode()
    return zlib.crc32(text), zlib.adler32(text)


_MIX = 0x9E3779B97F4A7C15  # odd, so that the running value never loses bits
_MASK = (1 << 62) - 1


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


def _gather_s(timeout_s: float, height: int) -> float:
    """How long a node of ``height`` waits for its children: the timeout, and a quarter more
    per level of inner nodes below, so that an inner child that lacks a member of its own
    subtree gives up first and names it."""
    return timeout_s * (1 + 0.25 * max(0, height - 1))


class _Place(NamedTuple):
    """Where a rank sits in a group's tree (computed once per group and rank)."""

    hashed: int
    parent: Optional[int]   # world rank, None for the root
    children: tuple         # world ranks
    depth: int
    gather_s_factor: float  # of the timeout: how long it waits for its children
    answer_s_factor: float  # of the timeout, plus the fixed part: how long for the answer


@functools.lru_cache(maxsize=1024)
def _place(group: tuple, rank: int) -> _Place:
    index = group.index(rank)
    size = len(group)
    parent = tree_parent(index)
    return _Place(group_hash(group), None if parent is None else group[parent],
                  tuple(group[i] for i in tree_children(index, size)), _depth(index),
                  _gather_s(1.0, tree_height(index, size)),
                  _gather_s(1.0, tree_height(0, size)))


def agree(ctl: MPI.Comm, group: Sequence[int], entries_digest: int, wants_full_round: bool,
          what: str, timeout_s: float, stall_s: float,
          idle: Optional[Callable[[], bool]] = None) -> Verdict:
    """Run the fixed-size round for this member of ``group`` (world ranks, sorted, on
    ``ctl``). Raises ``RipplesTimeoutError`` naming missing members when some never
    arrive within the timeout, on every member that did. ``idle``: see ``poll_until``."""
    group = tuple(group)
    rank = ctl.Get_rank()
    place = _place(group, rank)
    hashed = place.hashed
    attempt = next_attempt()
    posted = _now_ms()
    mine = (_UP, attempt, hashed, entries_digest,
            WANTS_FULL_ROUND if wants_full_round else 0, posted, posted)

    def describe_missing(missing: List[int], count: int) -> str:
        more = f" and {count - len(missing)} more" if count > len(missing) else ""
        return (f"{what} on group {_short(group)}: rank(s) {missing}{more} have not called "
                f"it (rank {rank} is waiting)")

    gather_s = timeout_s * place.gather_s_factor
    # A record older than its sender waits for the answer is stale (see the module doc);
    # join rounds are exempt, as a joined member's wait restarts while the others train.
    stale_s = None if idle is not None else _answer_wait_s(timeout_s, place, place.depth + 1)
    combined, delivered, failure = _gather(ctl, place.children, mine, posted, gather_s,
                                           stall_s, idle, describe_missing, stale_s)
    if failure is not None:  # a subtree is incomplete: tell both ways, then raise
        missing, count = failure
        if place.parent is not None:
            _send(ctl, _failure(_FAILED, attempt, hashed, missing, count), place.parent,
                  _TAG_UP)
        _send_down(ctl, delivered, _failure(_ERROR, 0, hashed, missing, count))
        raise RipplesTimeoutError(f"{describe_missing(missing, count)}: gave up after "
                                  f"{gather_s:g} s (Config.timeout_s / RIPPLES_TIMEOUT_S)",
                                  missing=missing)
    if place.parent is None:
        decision = _decide(combined, timeout_s, group[0])
    else:
        _send(ctl, combined, place.parent, _TAG_UP)
        wait_s = _answer_wait_s(timeout_s, place, place.depth)
        try:
            decision = _await_decision(ctl, place.parent, attempt, hashed, wait_s, stall_s,
                                       idle, lambda: (
                f"{what} on group {_short(group)}: rank {place.parent} (the member this "
                f"rank reports to) has not answered (rank {rank} is waiting)"))
        except RipplesTimeoutError:  # the members below learn it from here, not on their own
            _send_down(ctl, delivered, _failure(_ERROR, 0, hashed, [place.parent], 1))
            raise
    if delivered:
        _send_down(ctl, delivered, decision)
    kind = decision[_KIND]
    if kind == _ERROR:
        missing, count = _missing_of(decision)
        raise RipplesTimeoutError(f"{describe_missing(missing, count)}: the group gave up "
                                  "(Config.timeout_s / RIPPLES_TIMEOUT_S)", missing=missing)
    if decision[_GROUP] != hashed:  # another group's round reached this rank
        return Verdict(False, decision[_ROOT])
    return Verdict(kind == _UNANIMOUS, decision[_ROOT])


def _answer_wait_s(timeout_s: float, place: _Place, depth: int) -> float:
    """How long a member at ``depth`` waits for its parent's answer. The root answers
    within its own timeout, naming whoever is missing; a member gives up later, so that it
    only times out on its own when its parent is absent, and deeper members later still,
    so that they hear it from the member above first."""
    return (timeout_s * place.answer_s_factor + max(1.0, 0.5 * timeout_s)
            + 0.5 * (depth - 1))


def _gather(ctl, children, mine, posted, gather_s, stall_s, idle, describe_missing,
            stale_s: Optional[float]):
    """Collect one live record per child (none posted more than ``stale_s`` before this
    node's own). Returns (combined record, {child: its attempt}, None) or, when a subtree
    is incomplete, (None, delivered, (missing ranks, count))."""
    if not children:
        return mine, {}, None
    latest: Dict[int, Optional[tuple]] = {child: None for child in children}
    failures: List[tuple] = []
    buffer = bytearray(_RECORD.size)
    oldest_ms = posted - 1000 * stale_s if stale_s is not None else None

    def receive() -> bool:
        for child in children:
            while ctl.Iprobe(source=child, tag=_TAG_UP):
                ctl.Recv([buffer, MPI.BYTE], source=child, tag=_TAG_UP)
                message = _RECORD.unpack(buffer)
                kind = message[_KIND]
                before = latest[child]
                if kind == _UP:
                    if oldest_ms is None or message[_T_MAX] >= oldest_ms:
                        latest[child] = message
                elif before is not None and before[_ATTEMPT] == message[_ATTEMPT]:
                    latest[child] = None  # withdrawn, or failed below
                if kind == _FAILED and message[_T_MAX] >= posted:
                    failures.append(message)
        return bool(failures) or None not in latest.values()

    def describe() -> str:
        absent = [c for c, m in latest.items() if m is None]
        return describe_missing(absent[:MAX_NAMED], len(absent))

    try:
        poll_until(receive, Deadline(gather_s, stall_s, describe), idle)
    except RipplesTimeoutError:
        absent = [c for c, m in latest.items() if m is None]
        failures.append(_failure(_FAILED, 0, 0, absent[:MAX_NAMED], len(absent)))
    delivered = {c: m[_ATTEMPT] for c, m in latest.items() if m is not None}
    if failures:
        return None, delivered, _merge_missing(failures)
    flags, t_min, t_max = mine[_FLAGS], mine[_T_MIN], mine[_T_MAX]
    for record in latest.values():
        if record[_GROUP] != mine[_GROUP]:
            flags |= _FOREIGN
        elif record[_DIGEST] != mine[_DIGEST]:
            flags |= _DIFFERENT
        flags |= record[_FLAGS]
        t_min = min(t_min, record[_T_MIN])
        t_max = max(t_max, record[_T_MAX])
    return mine[:_FLAGS] + (flags, t_min, t_max), delivered, None


def _decide(combined: tuple, timeout_s: float, root: int) -> tuple:
    spread_ms = combined[_T_MAX] - combined[_T_MIN]
    unanimous = combined[_FLAGS] == 0 and spread_ms < 500 * timeout_s
    return (_UNANIMOUS if unanimous else _FULL_ROUND, 0, combined[_GROUP], root)


def _await_decision(ctl, parent, attempt, hashed, wait_s, stall_s, idle, describe) -> tuple:
    buffer = bytearray(_RECORD.size)
    request = [ctl.Irecv([buffer, MPI.BYTE], source=parent, tag=_TAG_DOWN)]
    answer = []

    def answered() -> bool:
        while request[0].Test():
            message = _RECORD.unpack(buffer)
            if message[_ATTEMPT] == attempt:
                answer.append(message)
                return True
            # an answer to an attempt this rank gave up: wait for the next one
            request[0] = ctl.Irecv([buffer, MPI.BYTE], source=parent, tag=_TAG_DOWN)
        return False

    try:
        poll_until(answered, Deadline(wait_s, stall_s, describe, lambda: [parent]), idle)
    except RipplesTimeoutError:
        request[0].Cancel()
        request[0].Wait()
        now = _now_ms()
        _send(ctl, (_WITHDRAW, attempt, hashed, 0, 0, now, now), parent, _TAG_UP)
        raise
    except BaseException:
        outbox.withdraw(request[0], buffers=(buffer,))
        raise
    return answer[0]


def _send_down(ctl, delivered: Dict[int, int], decision: tuple) -> None:
    for child, attempt in delivered.items():
        _send(ctl, decision[:_ATTEMPT] + (attempt,) + decision[_ATTEMPT + 1:], child,
              _TAG_DOWN)


_RECORD = struct.Struct(f"<{FIELDS}q")  # every message: FIELDS int64, 128 bytes


def _failure(kind, attempt, group, missing: Sequence[int], count: int) -> tuple:
    now = _now_ms()
    named = tuple(missing)[:MAX_NAMED]
    return (kind, attempt, group, 0, 0, now, now, count) + named


def _missing_of(message: tuple):
    count = message[_N_MISSING]
    return list(message[8:8 + min(count, MAX_NAMED)]), count


def _merge_missing(failures: Sequence[tuple]):
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


def _encode(message: tuple) -> bytes:
    """The bytes on the wire: ``message`` padded with zeros to ``FIELDS`` int64."""
    return _RECORD.pack(*message, *(0,) * (FIELDS - len(message)))


def _send(ctl, message: tuple, dest: int, tag: int) -> None:
    outbox.keep_until_complete(ctl.Isend([_encode(message), MPI.BYTE], dest=dest, tag=tag))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _short(group: Sequence[int]) -> str:
    """A group for messages: all of it when small, else its size and ends."""
    if len(group) <= 16:
        return str(tuple(group))
    return f"of {len(group)} ranks ({group[0]}..{group[-1]})"
