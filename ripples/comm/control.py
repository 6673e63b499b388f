"""Negotiation: the control round that decides which named collectives a group runs now.

Every collective has a name (given by the caller, or ``noname.<n>`` counted per group, so
ranks issuing unnamed collectives in the same order agree). A round starts with the
fixed-size exchange of ``ripples.comm.control_tree``: when every member has the same
collectives pending (the steady state of training) it settles the round in O(log P)
messages of 128 bytes, and every member runs everything it has pending, in order.

Otherwise the members run the full round: each sends the group's leader (its lowest rank)
a record of every collective it has pending on the group: name, signature (operation,
dtype, shapes, op, scaling) and, for collectives a joined rank can take part in, a wire
description. The leader answers each member with the names pending on *every* active
member, in the leader's submission order, and the members then run exactly those, in that
order. So collectives submitted in different orders on different ranks still meet by name,
as in Horovod's negotiation.

Polled with a deadline, the full round gives:

- a timeout: a member that never arrives is named, on every rank that did;
- mismatch detection: a name whose signatures differ, a member calling on another group,
  or members that all block on disjoint names (nothing could ever run) raise
  ``MismatchError`` on every member, listing each member's call;
- agreement on the communicator cache: if any member lacks the group's communicator, all
  rebuild it together, so eviction stays a local choice;
- Horovod's ``join()``: joined members send an empty record and are told which all-reduces,
  all-gathers and broadcasts to take part in with neutral contributions.

Records and answers carry the sender's attempt number, as in the tree: the leader keeps
each member's latest record, drops one its member withdrew (it gave up waiting) or one
posted longer ago than a member waits for the answer (but in join rounds), and a member
ignores answers to attempts it gave up, so a timed-out round cannot poison the next.
"""
from __future__ import annotations

import pickle
import time
from typing import Dict, List, Optional, Sequence, Tuple

from mpi4py import MPI

from ripples.comm import control_tree, outbox
from ripples.comm.mpi import Deadline, poll_until, wait_sends
from ripples.core.errors import MismatchError, RipplesError, RipplesTimeoutError

_TAG_RECORD = 11
_TAG_REPLY = 12

Entry = Tuple[str, str, str]  # (name, signature, wire); wire is "" if joined ranks cannot help


class Record:
    """What one member sends: its pending entries on ``group`` and its state.

    need_create: this member lacks the group's communicator.
    join_rounds: -1 while active; after ``join()``, the rounds it has answered since.
    blocked: the member's caller is blocked waiting on one of these entries.
    """

    __slots__ = ("group", "need_create", "join_rounds", "blocked", "entries", "attempt",
                 "posted")

    def __init__(self, group, need_create: bool, join_rounds: int, blocked: bool,
                 entries: Sequence[Entry], attempt: int = 0, posted: float = 0.0):
        self.group, self.need_create, self.join_rounds = tuple(group), need_create, join_rounds
        self.blocked, self.entries, self.attempt = blocked, tuple(entries), attempt
        self.posted = posted  # wall-clock seconds, when sent for the full round

    def encode(self) -> bytes:
        return pickle.dumps((self.group, self.need_create, self.join_rounds, self.blocked,
                             self.entries, self.attempt, self.posted),
                            protocol=pickle.HIGHEST_PROTOCOL)


class Decision:
    """What the leader decided for one member.

    create: rebuild the group communicator before the data moves.
    active: members contributing data (the others have joined).
    run: names to run now, in this order; for a joined member, ``(name, wire)`` pairs to
        take part in.
    failed: name -> error to raise for that collective.
    missing: name -> ranks that have not submitted it (for names that cannot run yet).
    last_joined: once every member has joined, the rank that joined last; else -1.
    """

    __slots__ = ("create", "active", "run", "failed", "missing", "last_joined")

    def __init__(self, create=False, active=0, run=(), failed=None, missing=None, last_joined=-1):
        self.create, self.active, self.run = create, active, list(run)
        self.failed: Dict[str, RipplesError] = failed or {}
        self.missing: Dict[str, List[int]] = missing or {}
        self.last_joined = last_joined


def negotiate(ctl: MPI.Comm, record: Record, what: str, timeout_s: float,
              stall_s: float, idle=None) -> Decision:
    """Run one control round for ``record.group`` (world ranks, sorted) and return this
    member's decision. Raises ``RipplesTimeoutError`` when a member (or, for a follower, the
    leader) does not arrive in time; per-name failures come back in ``Decision.failed``.
    ``idle``: called while waiting for the members (see ``poll_until``)."""
    group = record.group
    verdict = control_tree.agree(
        ctl, group, control_tree.digest(record.entries),
        record.need_create or record.join_rounds >= 0, what, timeout_s, stall_s, idle)
    if verdict.unanimous:
        return Decision(active=len(group), run=[e[0] for e in record.entries])
    record.attempt = control_tree.next_attempt()
    record.posted = time.time()
    if ctl.Get_rank() == verdict.leader:
        return _lead(ctl, record, what, timeout_s, stall_s, idle)
    return _follow(ctl, record, verdict.leader, what, timeout_s, stall_s, idle)


def _lead(ctl, mine: Record, what, timeout_s, stall_s, idle) -> Decision:
    group = mine.group
    members = group[1:]
    latest: Dict[int, Optional[Record]] = {member: None for member in members}
    status = MPI.Status()

    def receive() -> bool:
        for member in members:
            while ctl.Iprobe(source=member, tag=_TAG_RECORD, status=status):
                buffer = bytearray(status.Get_count(MPI.BYTE))
                ctl.Recv([buffer, MPI.BYTE], source=member, tag=_TAG_RECORD)
                message = pickle.loads(buffer)
                if message[0] != _WITHDRAW:
                    record = Record(*message)
                    # Older than a follower waits for the answer: withdrawn, though the
                    # withdrawal may show after it (as in the tree). Join rounds restart
                    # that wait while the others train: never stale.
                    if idle is not None or record.posted >= mine.posted - _follow_wait_s(
                            timeout_s):
                        latest[member] = record
                elif latest[member] is not None and latest[member].attempt == message[1]:
                    latest[member] = None
        return all(record is not None for record in latest.values())

    def absent() -> List[int]:
        return [m for m, record in latest.items() if record is None]

    def describe() -> str:
        return (f"{what} on group {group}: rank(s) {absent()} have not called it "
                f"(rank {group[0]} is waiting)")

    try:
        poll_until(receive, Deadline(timeout_s, stall_s, describe, absent), idle)
    except RipplesTimeoutError as exc:
        _send_all(ctl, {m: (r.attempt, ("error", "timeout", str(exc), exc.missing))
                        for m, r in latest.items() if r is not None},
                  timeout_s, stall_s, group, what)
        raise
    records = {group[0]: mine}
    records.update(latest)
    replies = judge(records, what)
    _send_all(ctl, {m: (latest[m].attempt, replies[m]) for m in members}, timeout_s, stall_s,
              group, what)
    return _decision(replies[group[0]], mine)


_WITHDRAW = "withdraw"  # a member's message that it gave up the attempt it names


def judge(records: Dict[int, Record], what: str) -> Dict[int, tuple]:
    """The reply for every member, from every member's record (a pure function)."""
    group = next(iter(records.values())).group
    ranks = sorted(records)
    calls_on = {r: rec.group for r, rec in records.items()}
    if len(set(calls_on.values())) > 1:
        lines = "; ".join(f"rank {r}: group {calls_on[r]} "
                          f"{[e[1] for e in records[r].entries] or '(nothing)'}" for r in ranks)
        problem = (f"{what} on group {group}: members called collectives on different groups "
                   f"({lines}). Every member must call the same collectives with the same "
                   "group, shape, dtype and op, in the same order across groups")
        return {r: ("error", "mismatch", problem) for r in ranks}
    create = any(rec.need_create for rec in records.values())
    joined = {r: rec.join_rounds for r, rec in records.items() if rec.join_rounds >= 0}
    active = [r for r in ranks if r not in joined]
    if not active:
        fresh = [r for r, rounds in joined.items() if rounds == 0]
        return {r: ("alljoined", max(fresh or joined)) for r in ranks}
    leader_order = records[active[0]].entries
    by_rank = {r: {e[0]: e for e in records[r].entries} for r in active}
    common = [e[0] for e in leader_order if all(e[0] in by_rank[r] for r in active)]
    failed: Dict[str, tuple] = {}
    run: List[str] = []
    for name in common:
        signatures = {r: by_rank[r][name][1] for r in active}
        if len(set(signatures.values())) > 1:
            lines = "; ".join(f"rank {r}: {s}" for r, s in sorted(signatures.items()))
            failed[name] = ("mismatch", f"{what} {name!r} on group {group}: members called it "
                            f"differently ({lines}). Every member must call a collective of "
                            "the same name with the same shape, dtype and op")
        elif joined and not by_rank[active[0]][name][2]:
            kind = signatures[active[0]].split(" ", 1)[0]
            failed[name] = ("mismatch", f"{kind} {name!r} on group {group} while rank(s) "
                            f"{sorted(joined)} have joined: after join() only allreduce, "
                            "allgather and broadcast may run until every rank has joined (only "
                            "allreduce with Config.horovod_join)")
        else:
            run.append(name)
    missing: Dict[str, List[int]] = {}
    for r in active:
        for name in by_rank[r]:
            if name not in missing and name not in failed and name not in run:
                missing[name] = [m for m in active if name not in by_rank[m]]
    if not run and not failed and missing and all(records[r].blocked for r in active):
        # Every member waits on a collective that some other member never submitted, and
        # none can submit more while it waits: nothing could ever run.
        lines = "; ".join(f"rank {r}: {sorted(by_rank[r])}" for r in active)
        problem = (f"{what} on group {group}: members are waiting on collectives of different "
                   f"names ({lines}). Every member must submit the same names. A "
                   "collective in a loop that ranks run different numbers of times (uneven "
                   "data, or hvd.DistributedSampler's shared epoch under sync='ripples' or "
                   "'adpsgd': a metric all-reduced every batch) pairs up if every rank calls "
                   "hvd.join() after the loop (hvd.average_model(model) joins first)")
        failed = {name: ("mismatch", problem) for name in missing}
        missing = {}
    replies = {r: ("ok", create, len(active), run,
                   {n: f for n, f in failed.items() if n in by_rank[r]},
                   {n: m for n, m in missing.items() if n in by_rank[r]}) for r in active}
    wires = [(name, by_rank[active[0]][name][2]) for name in run]
    replies.update({r: ("participate", create, len(active), wires, {}, {}) for r in joined})
    return replies


def _send_all(ctl, replies: dict, timeout_s, stall_s, group, what) -> None:
    requests = [ctl.Isend(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL), dest=member,
                          tag=_TAG_REPLY) for member, reply in replies.items()]
    deadline = Deadline(timeout_s, stall_s, lambda: f"{what} on group {group}: answering members")
    wait_sends(requests, deadline)


def _follow(ctl, mine: Record, leader: int, what, timeout_s, stall_s, idle) -> Decision:
    group = mine.group
    send = ctl.Isend(mine.encode(), dest=leader, tag=_TAG_RECORD)
    status = MPI.Status()
    reply = None

    def answered() -> bool:
        nonlocal reply
        while ctl.Iprobe(source=leader, tag=_TAG_REPLY, status=status):
            buffer = bytearray(status.Get_count(MPI.BYTE))
            ctl.Recv([buffer, MPI.BYTE], source=leader, tag=_TAG_REPLY)
            echo, answer = pickle.loads(buffer)
            if echo == mine.attempt:  # else an answer to an attempt this rank gave up
                reply = answer
                return True
        return False

    # The leader answers within its own timeout, naming whoever is missing; a follower
    # gives up later, so that it only ever times out on a leader that is itself absent.
    deadline = Deadline(_follow_wait_s(timeout_s), stall_s, lambda: (
        f"{what} on group {group}: leader rank {leader} has not answered "
        f"(rank {ctl.Get_rank()} is waiting)"), lambda: [leader])
    try:
        poll_until(answered, deadline, idle)
    except RipplesTimeoutError:
        withdraw = ctl.Isend(pickle.dumps((_WITHDRAW, mine.attempt)), dest=leader,
                             tag=_TAG_RECORD)
        outbox.keep_until_complete(send, withdraw)
        raise
    except BaseException:
        outbox.keep_until_complete(send)
        raise
    send.Wait()
    return _decision(reply, mine)


def _follow_wait_s(timeout_s: float) -> float:
    """How long a follower waits for the leader's answer (longer than the leader waits)."""
    return timeout_s + max(1.0, 0.5 * timeout_s)


def _decision(reply: tuple, mine: Record) -> Decision:
    kind = reply[0]
    if kind == "alljoined":
        return Decision(last_joined=reply[1])
    if kind == "error":
        if reply[1] == "timeout":
            raise RipplesTimeoutError(reply[2], missing=reply[3] if len(reply) > 3 else ())
        raise MismatchError(reply[2])
    _, create, active, run, failed, missing = reply
    errors = {name: (MismatchError if k == "mismatch" else RipplesTimeoutError)(text)
              for name, (k, text) in failed.items()}
    return Decision(create=create, active=active, run=run, failed=errors, missing=missing)


def missing_description(missing: Optional[List[int]]) -> str:
    """Words for the ranks that have not submitted a collective, as last reported."""
    if missing:
        return f"rank(s) {missing} have not submitted it"
    return "not every member submitted it"
