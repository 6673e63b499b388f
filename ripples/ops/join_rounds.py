"""The rounds of Horovod's ``join()``: a rank out of data takes part in the others' work.

A joined rank runs control rounds on the world group with an empty record until every
rank has joined. In each, the active ranks tell it which all-reduces, all-gathers and
broadcasts they run; it contributes neutral data (the op's identity, no rows, a discarded
receive). Planned all-reduces of gradient buckets (``BucketReducer``) get its zeros
between rounds.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Tuple

import numpy as np
from mpi4py import MPI

from ripples.comm.control import Record, negotiate
from ripples.core.errors import RipplesTimeoutError
from ripples.ops.request import fusion_chunks


class JoinRounds:
    """The joined side of one rank's engine.

    ``participate[kind](comm, wires)`` takes part in one agreed collective of ``kind``
    (``"allreduce"`` gets one fused run). ``comm_lock`` is the engine's lock of the
    control plane; ``restart_names()`` makes unnamed collectives count afresh; ``lanes``
    (``native_lane.Lanes``) settles the world lane's record round before each round.
    """

    def __init__(self, runtime, participate: Dict[str, Callable], comm_lock: threading.Lock,
                 restart_names: Callable[[], None], lanes):
        self._rt = runtime
        self._participate = participate
        self._comm_lock = comm_lock
        self._restart_names = restart_names
        self._lanes = lanes  # the world's native lane, whose record rounds a joined rank joins

    def run(self) -> int:
        """Take part until every rank has joined; returns the rank that joined last. The
        caller has finished its own pending collectives."""
        rt = self._rt
        if rt.size == 1:
            return rt.rank
        reducers = [r for r in list(rt.reducers) if rt.rank in r.group]
        for reducer in reducers:  # planned all-reduces of the active ranks get our zeros
            reducer.join_poll()

        steps_seen = 0

        def idle() -> bool:
            nonlocal steps_seen
            for poll in rt.join_poll_hooks:
                poll()
            ran = sum(reducer.join_poll() for reducer in reducers)
            steps_seen += ran
            return ran > 0

        rt.liveness.enter()
        try:
            return self._until_all(reducers, idle, lambda: steps_seen)
        finally:
            rt.liveness.leave()

    def _until_all(self, reducers, idle, steps_seen) -> int:
        """The join rounds, until every rank has joined; returns the last to join."""
        rt = self._rt
        rounds = 0
        while True:
            with self._comm_lock:
                record = Record(rt.world_group, False, rounds, False, [])
                try:
                    self._lanes.settle(rt.world_group)
                    decision = negotiate(rt.ctl, record, "join", rt.liveness.check_after_s(),
                                         rt.liveness.stall_s_now(), idle)
                except RipplesTimeoutError as exc:  # ranks still training are waited for
                    rt.liveness.keep_waiting(exc.missing, exc)
                    continue
                self._lanes.finish(rt.world_group)
                if decision.last_joined >= 0:
                    for reducer in reducers:
                        reducer.join_finish()
                    # Planned steps ran outside these rounds: a rank that took part in
                    # neither joined before someone else stopped training.
                    fresh = rounds == 0 and steps_seen() == 0
                    # A buffer all-reduce: mpi4py's pickled one keeps the GIL while it
                    # waits, and the watch (a thread) could not end a frozen member's wait.
                    last = np.array([rt.rank if fresh else -1], dtype=np.int64)
                    with rt.data_watch.phase(rt.world_group, "the end of join"):
                        rt.ctl.Allreduce(MPI.IN_PLACE, last, op=MPI.MAX)
                    if last[0] >= 0:
                        decision.last_joined = int(last[0])
                    # Ranks that joined early ran fewer unnamed collectives; every rank is
                    # at this point together, so counting starts afresh everywhere.
                    self._restart_names()
                    return decision.last_joined
                self._take_part(decision.run)
            rounds += 1

    def _take_part(self, wires: List[Tuple[str, str]]) -> None:
        """A joined rank's side of the collectives the active ranks agreed on."""
        with self._rt.data_watch.phase(self._rt.world_group, "a collective (as a joined rank)"):
            self._contribute(wires)

    def _contribute(self, wires: List[Tuple[str, str]]) -> None:
        comm = self._rt.world
        threshold = max(1, self._rt.config.fusion_threshold_bytes)
        i = 0
        while i < len(wires):
            kind = wires[i][1].split("|", 1)[0]
            if kind != "allreduce":
                self._participate[kind](comm, [wires[i][1]])
                i += 1
                continue
            key = wires[i][1].split("|", 2)[1]
            j = i
            while j < len(wires) and wires[j][1].startswith(f"allreduce|{key}|"):
                j += 1
            run = [w for _, w in wires[i:j]]
            for chunk in fusion_chunks([int(w.rsplit("|", 1)[1]) for w in run], threshold):
                self._participate["allreduce"](comm, [run[k] for k in chunk])
            i = j
