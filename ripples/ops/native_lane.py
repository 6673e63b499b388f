"""The native steady-state lane: a repeated host all-reduce in one GIL-free call.

Python stays the control plane. A group's lane is armed, collectively, after the second
control round on the group that ran a single eligible all-reduce (host float32/float64,
op Sum or Average, no prescale/postscale, not over a ``PeerRing``), when every member has
the native library and holds fewer than ``_MAX_LANES`` lanes (else the group's lane stays
off on all of them for the rest of the run): the members then build a duplicate
communicator of the group. From then on every control round on
the group starts with the lane's record round (``csrc/native_lane.c``): one all-reduce of
(members on a plan, plan id and its square, step and its square, members) and a slot that
carries the data of a call of at most 128 elements, so that a small planned call costs a
single all-reduce (summed in float64, rounded once).

- A blocking ``allreduce_``/``partial_allreduce_`` whose call shape was planned (it ran
  once through Python on an armed lane) posts its plan: when every member posted the same
  plan at the same step, the C call all-reduces the data in place and scales it, and
  nothing else runs (``run_planned``).
- Anything else posts plan 0, as does a member that called something else: the record
  then proves that this round is not the plan's, every member knows it, and all of them
  run the usual negotiation (``Lanes.settle``), which raises the same mismatch errors,
  runs ``join()`` and asks about absent members as before.

Waits are bounded in C; a call that has waited its share returns, and Python keeps
waiting on the same request under the liveness rules. A record round is never abandoned
(MPI cannot cancel a collective): one left pending is continued by the next round on the
group, so the rounds stay matched across members. ``settle`` only posts the record before
a control round, and ``finish`` collects it after, so the negotiation keeps its timing and
its error messages.

``RIPPLES_NATIVE_LANE=0`` turns the lane off; like every ``RIPPLES_*`` setting it must be
equal on all ranks. Where the library cannot be built, the Python path runs everything;
``status()`` says which.
"""
from __future__ import annotations

import ctypes
import sys
import time
import zlib
from typing import Dict, List, Optional

import numpy as np
import torch
from mpi4py import MPI

from ripples import runtime as _runtime
from ripples.comm import outbox
from ripples.comm.mpi import Deadline, poll_until
from ripples.core.config import Config
from ripples.core.errors import RipplesError
from ripples.ops import native_build
from ripples.ops.native_build import build, library

ENV = "RIPPLES_NATIVE_LANE"
OK, RECORD_PENDING, NOT_UNANIMOUS, DATA_PENDING, AGREED = 0, 1, 2, 3, 4
_MODULUS = 1 << 20
_FIRST_WAIT_S = 0.05   # what the first C call waits before Python takes over the wait
_SLICE_S = 0.002       # each later C call's share of a long wait
_DTYPES = {torch.float32: 0, torch.float64: 1}
_ARM_AFTER = 2         # eligible rounds on a group before its lane is armed
# Lanes a rank holds at most. Each keeps a communicator of its own for the rest of the run,
# and a schedule that keeps forming new groups (the group generator: about 100 groups hold
# a given rank at 8 ranks, tens of thousands at 64) would otherwise arm one for every group
# it meets twice, beyond the bound ``Config.cache_capacity`` sets on group communicators.
_MAX_LANES = 16
_ANNOUNCE_AFTER_S = 0.05  # a member waiting this long in a record round says so
_LISTEN_S = 0.2        # how long a member giving up listens for the others' word
_TAG_WAITING = 91


def status(config: Optional[Config] = None) -> str:
    """One line for ``ripples info``: whether the lane is on, built, and why not
    (``config``: default ``Config.load()``)."""
    if not (config or Config.load()).native_lane:
        return f"off ({ENV}=0)"
    lib = library()
    if lib is None:
        return ("unavailable, the Python path runs every collective: "
                f"{native_build.error()}")
    return f"on ({lib._name})"


# ------------------------------------------------------------------ one group's lane

class Lane:
    """A group's duplicate communicator and the C state of its record rounds.

    ``step`` counts completed record rounds (equal on every member; the C state counts them);
    ``owed`` is set when a planned call's record round ended "not the plan": the next
    control round on the group is then already settled. ``busy`` while a request of the C
    state is pending."""

    __slots__ = ("group", "comm", "handle", "owed", "busy", "broken", "generation",
                 "others", "keep", "_announced", "_notes", "_heard", "_run", "_data", "_call",
                 "_steps", "_mpi_error")

    def __init__(self, group, comm: MPI.Comm, handle: int, generation: int, rank: int,
                 lib=None):
        self.group, self.comm, self.handle, self.generation = group, comm, handle, generation
        self.owed, self.busy, self.broken = False, False, False
        self.others = [m for m in group if m != rank]
        self.keep = None  # the tensor a pending data phase writes into
        self._announced = -1  # the step this member told the others it waits in
        self._notes: list = []
        self._heard: Dict[int, set] = {}
        self._run = lib.rl_lane_run if lib is not None else None
        self._data = lib.rl_lane_data if lib is not None else None
        self._call = lib.rl_lane_call if lib is not None else None
        self._steps = lib.rl_lane_steps if lib is not None else None
        self._mpi_error = lib.rl_lane_mpi_error if lib is not None else None

    @property
    def step(self) -> int:
        return self._steps(self.handle)

    # Who is absent from a record round (slow path only): a member that has waited a while
    # tells the others so; whoever has not told is named when the wait gives up.

    def announce(self) -> None:
        """Tell the other members that this one waits in the current record round."""
        if self._announced == self.step:
            return
        self._announced = self.step
        self._notes = [r for r in self._notes if not r.Test()]
        for index, member in enumerate(self.group):
            if member in self.others:
                self._notes.append(self.comm.isend(self.step, dest=index, tag=_TAG_WAITING))

    def hand_over_notes(self) -> None:
        """Leave the notes still on their way to the outbox (closing: a peer may take them
        later, and MPI reads their buffers until then)."""
        outbox.keep_until_complete(*self._notes)
        self._notes = []

    def absent(self, listen_s: float = _LISTEN_S) -> List[int]:
        """The members that have not said they wait in this round (listening ``listen_s``)."""
        end = time.monotonic() + listen_s
        status = MPI.Status()
        while True:
            while self.comm.iprobe(source=MPI.ANY_SOURCE, tag=_TAG_WAITING, status=status):
                source = status.Get_source()
                step = self.comm.recv(source=source, tag=_TAG_WAITING)
                self._heard.setdefault(step, set()).add(self.group[source])
            heard = self._heard.get(self.step, set())
            missing = [m for m in self.others if m not in heard]
            if not missing or time.monotonic() >= end:
                self._heard = {k: v for k, v in self._heard.items() if k >= self.step}
                return missing
            time.sleep(0.005)

    def run(self, plan: int, pointer: int, count: int, dtype: int, average: int,
            wait_s: float) -> int:
        return self._outcome(self._run(self.handle, plan, pointer, count, dtype, average,
                                       wait_s))

    def call(self, arguments: int, pointer: int) -> int:
        """A new round of a planned call (``arguments``: the address of its ``_CallArguments``)
        on the tensor at ``pointer``."""
        code = self._call(arguments, pointer)
        return code if code == OK else self._outcome(code)

    def data(self) -> int:
        """The blocking data phase of an agreed step (``AGREED``)."""
        return self._outcome(self._data(self.handle))

    def _outcome(self, code: int) -> int:
        if code < 0:
            self.broken = True
            # The MPI error as the cause: a member's death, or the communicator revoked
            # after one, is then recovered from under fault tolerance (Runtime.raised).
            cause = MPI.Exception(self._mpi_error(self.handle)) if code == -1 else None
            raise RipplesError(f"the native lane of group {self.group} failed ({cause or code}); "
                               f"set {ENV}=0 to run without it") from cause
        self.busy = code in (RECORD_PENDING, DATA_PENDING, AGREED)
        if code in (OK, NOT_UNANIMOUS):
            self.keep = None
        return code


class Lanes:
    """The lanes of one rank's engine, by group. Calls that talk to the members hold the
    engine's communication lock (the engine calls ``settle`` and ``consider`` in its control
    rounds; ``run_planned`` takes the lock itself)."""

    def __init__(self, runtime):
        self._rt = runtime
        self._by_group: Dict[tuple, Lane] = {}
        self._seen: Dict[tuple, int] = {}
        self._generation = runtime.generation
        self.on = runtime.config.native_lane
        self.paused = False  # see pause()

    def get(self, group) -> Optional[Lane]:
        if self._generation != self._rt.generation:  # the world was rebuilt: start afresh
            self._by_group.clear()
            self._seen.clear()
            self._generation = self._rt.generation
        lane = self._by_group.get(group)
        return None if lane is None or lane.broken or self.paused else lane

    def pause(self, paused: bool = True) -> None:
        """Stop (or resume) using the armed lanes, so that every collective takes the Python
        path as with ``RIPPLES_NATIVE_LANE=0`` (for side-by-side measurements). Collective:
        every rank must pause and resume between the same collectives."""
        self.paused = paused

    def settle(self, group) -> None:
        """Before a control round on ``group``: post its lane's record round with plan 0, so
        that members on a planned call learn that this round is not theirs. It does not
        wait: the control round that follows keeps its own timing and errors, and ``finish``
        collects the record afterwards. A record still pending from an earlier round is
        continued instead; one that completes on a plan (this member gave up waiting on
        that call, the others have now made it) runs that call's data phase first."""
        lane = self.get(group)
        if lane is None:
            return
        if lane.owed:
            lane.owed = False
            return
        while True:
            code = lane.run(0, 0, 0, 0, 0, 0.0)
            if code in (NOT_UNANIMOUS, RECORD_PENDING):
                return
            self._late_data(lane, code)

    def finish(self, group) -> None:
        """After a control round on ``group`` that every member took part in: collect the
        record ``settle`` posted (every member has posted it, so it completes at once)."""
        lane = self.get(group)
        if lane is None or not lane.busy:
            return
        rt = self._rt
        deadline = Deadline(rt.liveness.check_after_s(), rt.config.stall_warning_s, lambda: (
            f"the native lane of group {group}: a member has not posted the record of a "
            f"round every member took part in (rank {rt.rank} is waiting); set {ENV}=0 and "
            "report this"), lambda: lane.others)
        outcome = []

        def done() -> bool:
            outcome[:] = [lane.run(0, 0, 0, 0, 0, _SLICE_S)]
            return outcome[0] != RECORD_PENDING

        poll_until(done, deadline)
        if outcome[0] != NOT_UNANIMOUS:  # a plan's round cannot end a control round
            self._late_data(lane, outcome[0])
            lane.broken = True
            raise RipplesError(f"the native lane of group {group} is out of step with the "
                               f"control rounds (rank {rt.rank}); set {ENV}=0 and report this")

    def _late_data(self, lane: Lane, code: int) -> None:
        """Finish the data phase of a planned call whose record completed late."""
        with self._rt.data_watch.phase(lane.group, f"a planned all-reduce on {lane.group}"):
            while code == DATA_PENDING:
                code = lane.run(0, 0, 0, 0, 0, 1.0)
            if code == AGREED:
                lane.data()

    def armed(self) -> int:
        """How many lanes this rank holds (each with a communicator of its own)."""
        return sum(lane is not _OFF for lane in self._by_group.values())

    def consider(self, group, requests, comm) -> None:
        """After a control round on ``group`` ran ``requests`` on the group's communicator
        ``comm``: arm the group's lane on the round every member counts as the
        ``_ARM_AFTER``-th eligible one (collective over the members)."""
        if (not self.on or comm is None or len(requests) != 1 or len(group) < 2
                or group in self._by_group):
            return
        if not _eligible_wire(requests[0].wire):
            return
        rt = self._rt
        if rt.ring_carries(group, requests[0].nbytes):
            return  # this group's all-reduce goes around the ring: keep its numerics
        seen = self._seen.get(group, 0) + 1
        self._seen[group] = seen
        if seen == _ARM_AFTER:
            self._arm(group, comm)

    def _arm(self, group, group_comm: MPI.Comm) -> None:
        rt = self._rt
        lib = library()
        # blocking collectives: bounded as a data phase is (a member may be cut off now)
        with rt.data_watch.phase(group, f"arming the native lane of group {group}"):
            # The lane runs on every member or on none: each must have the library and room
            # for one more lane, asked on the group's communicator before a new one is made
            # (a buffer all-reduce: it releases the GIL, so the watch can end a frozen wait).
            ready = np.array([lib is not None and self.armed() < _MAX_LANES], dtype=np.int32)
            group_comm.Allreduce(MPI.IN_PLACE, ready, op=MPI.MIN)
            if not ready[0]:
                self._by_group[group] = _OFF
                return
            if group == rt.world_group:
                comm = rt.world.Dup()
            else:
                members = rt.world.Get_group().Incl(list(group))
                comm = rt.world.Create_group(members, tag=_ARM_TAG)
                members.Free()
        handle = lib.rl_lane_new(MPI._addressof(comm), comm.Get_size())
        if not handle:  # calloc failed: this process is out of memory
            raise MemoryError(f"rank {rt.rank}: no memory for the native lane of group {group}; "
                              f"free memory, or set {ENV}=0 on every rank")
        self._by_group[group] = Lane(group, comm, handle, rt.generation, rt.rank, lib)

    def comms(self) -> List[MPI.Comm]:
        """The lanes' communicators (revoked with the world's after a death)."""
        return [lane.comm for lane in self._by_group.values() if lane is not _OFF]

    def close(self) -> None:
        for lane in self._by_group.values():
            lane.broken = True  # plans still holding it must not call it
            if lane is not _OFF and not lane.busy:
                library().rl_lane_free(lane.handle)
            lane.hand_over_notes()
        self._by_group.clear()


_ARM_TAG = 7301
_OFF = Lane((), MPI.COMM_NULL, 0, -1, -1)
_OFF.broken = True


def _eligible_wire(wire: str) -> bool:
    """Whether an agreed all-reduce (its wire text, equal on every member) fits the lane."""
    fields = wire.split("|")
    if len(fields) < 2 or fields[0] != "allreduce":
        return False
    key = fields[1].split(":")
    return (len(key) == 6 and key[0] in ("allreduce", "partial_allreduce")
            and key[1] in ("float32", "float64") and key[2] in ("Average", "Sum")
            and key[3] == "1.0" and key[4] == "1.0" and key[5] == "cpu")


# ------------------------------------------------------------------ planned calls

class _CallArguments(ctypes.Structure):
    """``rl_call`` of ``csrc/native_lane.c``: a plan's fixed arguments, in C."""
    _fields_ = [("lane", ctypes.c_void_p), ("plan", ctypes.c_int64), ("count", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("average", ctypes.c_int32),
                ("first_wait_s", ctypes.c_double)]


class _Plan:
    __slots__ = ("lane", "plan", "dtype", "average", "numel", "owner", "group", "what", "name",
                 "away", "holds", "arguments", "address")


_plans: Dict[tuple, _Plan] = {}


def run_planned(key: tuple, tensor: torch.Tensor) -> bool:
    """Run a blocking in-place all-reduce of ``tensor`` through its plan (``key``: the call
    shape, built by the caller); False when it must take the Python path (no plan yet, the
    engine busy, the members on something else: the caller then runs it as usual)."""
    plan = _plans.get(key)
    if plan is None or tensor.is_cuda:  # plans are for host memory; keys hold no device
        return False
    rt = _runtime.current()
    lane = plan.lane
    engine = rt.engine
    if (plan.owner is not engine or lane.broken or lane.busy or lane.owed or engine._pending
            or engine.lanes.paused or lane.generation != rt.generation or tensor.requires_grad
            or not tensor.is_contiguous() or rt.timeline.enabled):
        return False
    if plan.away and rt.script_collective_hooks:
        rt.before_script_collective(plan.group)  # may run collectives itself: before the lock
    if not engine._comm_lock.acquire(False):
        return False
    if plan.away and rt.away_hooks:
        rt.left_training_step()
    try:
        code = lane.call(plan.address, tensor.data_ptr())
        if code == OK:
            return True
        if code == NOT_UNANIMOUS:
            lane.owed = True
            return False
        lane.keep = tensor
        if code == AGREED:
            with rt.data_watch.phase(lane.group, f"{plan.what} on group {lane.group}"):
                return lane.data() == OK
        return _wait(rt, plan, lane) == OK
    except Exception as exc:
        failure = exc
    finally:
        engine._comm_lock.release()
    # As the Python path's synchronize(): a dead or silent member is recovered from under
    # fault tolerance (outside the engine's lock: the recovery resets the engine).
    raise rt.raised(failure, lane.generation) from failure


def run_planned_into(key: tuple, tensor: torch.Tensor) -> Optional[torch.Tensor]:
    """``run_planned`` on a copy of ``tensor``: the reduced copy, or None when the call
    must take the Python path (``tensor`` is left as it was)."""
    if key not in _plans or tensor.is_cuda or tensor.requires_grad:
        return None
    output = tensor.clone(memory_format=torch.contiguous_format)
    return output if run_planned(key, output) else None


def _wait(rt, plan: _Plan, lane: Lane) -> int:
    """The long wait of a planned call (peers late, or a long data phase), under the
    liveness rules; the data phase is watched as the Python path's is."""
    where = f"{plan.what} {plan.name or '(unnamed)'!r} on group {lane.group}"
    code = RECORD_PENDING

    absent: List[int] = []

    def done() -> bool:
        nonlocal code
        code = lane.run(0, 0, 0, 0, 0, _SLICE_S)
        return code != RECORD_PENDING

    def describe() -> str:
        absent[:] = lane.absent()
        return f"{where}: rank(s) {absent} have not called it (rank {rt.rank} is waiting)"

    rt.liveness.enter()
    lane.announce()
    try:
        deadline = Deadline(rt.liveness.check_after_s(), rt.liveness.stall_s_now(), describe,
                            lambda: absent, rt.liveness)
        # On a timeout the record stays posted with this call's tensor (kept alive): the next
        # control round on the group continues it, and runs its data phase should the
        # others make this call after all.
        poll_until(done, deadline)
        if code in (DATA_PENDING, AGREED):
            with rt.data_watch.phase(lane.group, where):
                while code == DATA_PENDING:
                    code = lane.run(0, 0, 0, 0, 0, 1.0)
                if code == AGREED:
                    code = lane.data()
    finally:
        rt.liveness.leave()
    if code == NOT_UNANIMOUS:
        lane.owed = True
    return code


def register(key: tuple, tensor: torch.Tensor, group, what: str, name, average: bool,
             holds=None) -> None:
    """After a blocking call of ``key``'s shape ran through Python: plan the next ones when
    the group's lane is armed and the call fits (see the module doc). ``holds``: an object
    whose ``id`` is in ``key`` (kept alive so that the id is not reused)."""
    if key in _plans or tensor.dtype not in _DTYPES or tensor.is_cuda or tensor.requires_grad:
        return
    rt = _runtime.current()
    lane = rt.engine.lanes.get(tuple(group))
    if (lane is None or not tensor.is_contiguous() or tensor.numel() >= 1 << 31
            or rt.ring_carries(group, tensor.numel() * tensor.element_size())):
        return  # (the ring's calls keep its numerics and its speed across hosts)
    plan = _Plan()
    plan.lane, plan.owner, plan.holds = lane, rt.engine, holds
    plan.away = what == "allreduce"  # a collective of the script (see Runtime.away_hooks)
    plan.dtype, plan.average, plan.numel = _DTYPES[tensor.dtype], int(average), tensor.numel()
    plan.group, plan.what, plan.name = tuple(group), what, name
    # the shape too: members on one plan id hold tensors that the Python path would accept
    text = repr((what, name, tuple(group), str(tensor.dtype), tuple(tensor.shape),
                 bool(average)))
    plan.plan = zlib.crc32(text.encode()) % (_MODULUS - 1) + 1
    plan.arguments = _CallArguments(lane.handle, plan.plan, plan.numel, plan.dtype,
                                    plan.average, _FIRST_WAIT_S)
    plan.address = ctypes.addressof(plan.arguments)
    if len(_plans) > _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


_MAX_PLANS = 4096


def forget() -> None:
    """Drop every plan (a new runtime, or tests)."""
    _plans.clear()


def main(argv=None) -> int:
    """``python -m ripples.ops.native_lane``: build the lane now and print its status."""
    try:
        print(build())
    except RuntimeError as exc:
        print(f"cannot build the native lane: {exc}", file=sys.stderr)
        return 1
    print(status())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
