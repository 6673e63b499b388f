"""The control exchange that precedes every collective on a group of ranks.

Before the data moves, each member sends a short record to the group's leader (its lowest
rank) over a private control communicator, and the leader answers everyone. Polled with a
deadline, this one round trip gives every collective:

- a timeout: a member that never arrives is named, on every rank that did, instead of a hang;
- agreement on what is being run: the members' group, operation, shapes and dtypes must
  match, or every member raises ``MismatchError`` listing each member's call;
- agreement on the communicator cache: if any member no longer holds the group's cached
  communicator, all members rebuild it together, so eviction can stay a purely local choice;
- Horovod's ``join()``: members that have joined answer every all-reduce of the others with
  the identity element until all have joined.

The data collective that follows is MPI's blocking one, which is several times faster than
its non-blocking form in Open MPI (measured: 1 MB all-reduce, 2 ranks, 108 us vs 227 us).
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from mpi4py import MPI

from ripples.comm.mpi import Deadline, wait_all
from ripples.errors import MismatchError, RipplesError, RipplesTimeoutError

RECORD_BYTES = 512
# Small enough to travel eagerly through shared memory (Open MPI's limit is 4 KiB with the
# header); long error texts follow in a second message.
REPLY_BYTES = 256
_TAG_RECORD = 11
_TAG_REPLY = 12
_TAG_DETAIL = 13
_SEP = "\x1f"
_DETAILED = ("mismatch", "timeout")


class Agreement:
    """What the leader decided for one member.

    create: rebuild the group communicator before the data moves.
    active: members that contribute data (the others have joined).
    participate: for a joined member, the wire format ``"OP:DTYPE:NUMEL"`` of the all-reduce
        it must take part in with identity elements; empty otherwise.
    last_joined: once every member has joined, the rank that joined last; else -1.
    """

    __slots__ = ("create", "active", "participate", "last_joined")

    def __init__(self, create=False, active=0, participate="", last_joined=-1):
        self.create, self.active = create, active
        self.participate, self.last_joined = participate, last_joined


@functools.lru_cache(maxsize=1024)
def _encoded(text: str, size: int) -> bytes:
    """``text`` as a zero-padded buffer of ``size`` bytes (cached: steady-state calls repeat)."""
    return text.encode("utf-8")[:size].ljust(size, b"\0")


def _decode(buf: np.ndarray) -> str:
    return buf.tobytes().split(b"\0", 1)[0].decode("utf-8", errors="replace")


def agree(ctl: MPI.Comm, group: Sequence[int], what: str, signature: str, need_create: bool,
          timeout_s: float, stall_s: float, wire: str = "", join_rounds: int = -1) -> Agreement:
    """Run the control round trip for one collective among ``group`` (world ranks, sorted).

    ``what`` names the operation for messages; ``signature`` must be identical on every
    active member (operation, dtype, shapes). ``wire`` describes an all-reduce's buffer so
    joined members can take part; ``join_rounds >= 0`` marks the caller as joined (the
    number of rounds it has already answered). Raises ``MismatchError`` or
    ``RipplesTimeoutError`` on every member that took part.
    """
    me = ctl.Get_rank()
    leader = group[0]
    record = _SEP.join([str(int(need_create)), str(join_rounds), wire, str(group), signature])
    if me == leader:
        return _lead(ctl, group, what, record, timeout_s, stall_s)
    return _follow(ctl, leader, group, what, record, timeout_s, stall_s)


def _lead(ctl, group, what, record, timeout_s, stall_s) -> Agreement:
    members = group[1:]
    inbox = [np.empty(RECORD_BYTES, dtype=np.uint8) for _ in members]
    requests = [ctl.Irecv(buf, source=src, tag=_TAG_RECORD) for buf, src in zip(inbox, members)]

    def describe() -> str:
        missing = [m for m, r in zip(members, requests) if not r.Test()]
        return (f"{what} on group {tuple(group)}: rank(s) {missing} have not called it "
                f"(rank {group[0]} is waiting)")

    try:
        wait_all(requests, Deadline(timeout_s, stall_s, describe))
    except RipplesTimeoutError as exc:
        arrived = [m for m, r in zip(members, requests) if r.Test()]
        for r in requests:
            if not r.Test():
                r.Cancel()
        _reply(ctl, {m: f"timeout{_SEP}{exc}" for m in arrived}, timeout_s, stall_s, group, what)
        raise
    mine = _encoded(record, RECORD_BYTES)
    if record.startswith(_PLAIN) and all(buf.tobytes() == mine for buf in inbox):
        # Steady state: everyone called the same thing, nobody lacks the communicator.
        verdict = f"ok{_SEP}0{_SEP}{len(group)}"
        _reply(ctl, {m: verdict for m in members}, timeout_s, stall_s, group, what)
        return Agreement(create=False, active=len(group))
    records = {group[0]: record}
    records.update({m: _decode(buf) for m, buf in zip(members, inbox)})
    verdicts = _judge(records, group, what)
    _reply(ctl, {m: verdicts[m] for m in members}, timeout_s, stall_s, group, what)
    return _outcome(verdicts[group[0]])


_PLAIN = f"0{_SEP}-1{_SEP}"  # record prefix: holds the communicator, has not joined


def _judge(records: dict, group, what: str) -> dict:
    """The verdict text for every member, from every member's record."""
    fields = {rank: (text.split(_SEP, 4) + ["?"] * 5)[:5] for rank, text in records.items()}
    create = "1" if any(f[0] == "1" for f in fields.values()) else "0"
    joined = {rank: int(f[1]) for rank, f in fields.items() if int(f[1]) >= 0}
    active = {rank: f for rank, f in fields.items() if rank not in joined}
    if not active:
        fresh = [rank for rank, rounds in joined.items() if rounds == 0]
        last = max(fresh or joined)
        return {rank: f"alljoined{_SEP}{last}" for rank in records}
    calls = {rank: (f[3], f[4]) for rank, f in active.items()}
    problem = ""
    if len(set(calls.values())) > 1:
        lines = "; ".join(f"rank {rank}: group {g} {sig}" for rank, (g, sig) in sorted(calls.items()))
        problem = (f"{what} on group {tuple(group)}: members called it differently ({lines}). "
                   "Every member must call the same collective with the same group, shape, "
                   "dtype and op, in the same order")
    wire = next(iter(active.values()))[2]
    if joined and not problem and not wire:
        problem = (f"{what} on group {tuple(group)} while rank(s) {sorted(joined)} have joined: "
                   "after join() only all-reduce may run until every rank has joined")
    if problem:
        return {rank: f"mismatch{_SEP}{problem}" for rank in records}
    verdicts = {rank: f"ok{_SEP}{create}{_SEP}{len(active)}" for rank in active}
    verdicts.update({rank: f"participate{_SEP}{create}{_SEP}{wire}" for rank in joined})
    return verdicts


def _reply(ctl, verdicts: dict, timeout_s, stall_s, group, what) -> None:
    requests = []
    for member, verdict in verdicts.items():
        kind, _, detail = verdict.partition(_SEP)
        if kind in _DETAILED:
            requests.append(ctl.Isend(_encoded(kind, REPLY_BYTES), dest=member, tag=_TAG_REPLY))
            requests.append(ctl.Isend(detail.encode("utf-8"), dest=member, tag=_TAG_DETAIL))
        else:
            requests.append(ctl.Isend(_encoded(verdict, REPLY_BYTES), dest=member, tag=_TAG_REPLY))
    wait_all(requests, Deadline(timeout_s, stall_s,
                                lambda: f"{what} on group {tuple(group)}: answering members"))


def _follow(ctl, leader, group, what, record, timeout_s, stall_s) -> Agreement:
    reply = np.empty(REPLY_BYTES, dtype=np.uint8)
    send = ctl.Isend(_encoded(record, RECORD_BYTES), dest=leader, tag=_TAG_RECORD)
    recv = ctl.Irecv(reply, source=leader, tag=_TAG_REPLY)
    # The leader answers within its own timeout, naming whoever is missing; a follower
    # gives up later, so that it only ever times out on a leader that is itself absent.
    deadline = Deadline(timeout_s + max(1.0, 0.5 * timeout_s), stall_s, lambda: (
        f"{what} on group {tuple(group)}: leader rank {leader} has not answered "
        f"(rank {ctl.Get_rank()} is waiting)"))
    try:
        wait_all([send, recv], deadline)
        verdict = _decode(reply)
        if verdict in _DETAILED:
            status = MPI.Status()
            while not ctl.Iprobe(source=leader, tag=_TAG_DETAIL, status=status):
                deadline.check()
            detail = bytearray(status.Get_count(MPI.BYTE))
            ctl.Recv([detail, MPI.BYTE], source=leader, tag=_TAG_DETAIL)
            verdict = f"{verdict}{_SEP}{detail.decode('utf-8', errors='replace')}"
    except RipplesTimeoutError:
        for r in (send, recv):
            if not r.Test():
                r.Cancel()
        raise
    return _outcome(verdict)


def _outcome(verdict: str) -> Agreement:
    kind, *rest = verdict.split(_SEP)
    if kind == "ok":
        return Agreement(create=rest[0] == "1", active=int(rest[1]))
    if kind == "participate":
        return Agreement(create=rest[0] == "1", participate=rest[1])
    if kind == "alljoined":
        return Agreement(last_joined=int(rest[0]))
    if kind == "mismatch":
        raise MismatchError(_SEP.join(rest))
    if kind == "timeout":
        raise RipplesTimeoutError(_SEP.join(rest))
    raise RipplesError(f"unexpected control reply {verdict!r}")
