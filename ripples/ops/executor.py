"""Running the collectives a control round agreed on: fusion, the data phase, completion.

The engine hands over the requests every member agreed to run now, in the leader's order;
consecutive all-reduces of one fusion key are fused into runs of at most
``Config.fusion_threshold_bytes``, everything else runs on its own. Each run's data
movement is watched (``Runtime.data_watch``), recorded on the timeline under the names
it carries, and its handles are finished (an error is kept for ``synchronize``).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from ripples.comm.mpi import Deadline
from ripples.ops.half_allreduce import HALF_DTYPES
from ripples.ops.request import Request, fusion_chunks, ring_can_carry
from ripples.ops.ring_allreduce import PeerRing


class Executor:
    """Executes agreed requests of one rank.

    ``reduce_fused(carrier, group, active, requests)`` all-reduces one fused run (carrier:
    the group's communicator or its ``PeerRing``); ``finish(requests, error)`` completes
    their handles and removes them from the engine's pending list.
    """

    def __init__(self, runtime, reduce_fused: Callable,
                 finish: Callable[[Sequence[Request], Optional[BaseException]], None]):
        self._rt = runtime
        self._reduce_fused = reduce_fused
        self._finish = finish

    def ring(self, group) -> Optional[PeerRing]:
        """The point-to-point ring of ``group`` (the world's too), for the runs it carries
        (``Runtime.ring_carries``); None where everything takes MPI's all-reduce
        (``Config.group_allreduce="communicator"``)."""
        rt = self._rt
        if rt.config.group_transport == "communicator":
            return None
        config = rt.config
        return PeerRing(rt.peers, group, rt.rank,
                        lambda describe, missing: Deadline(
                            config.timeout_s, config.stall_warning_s, describe,
                            lambda: missing, rt.liveness))

    def execute(self, comm, group, active: int, requests: List[Request],
                ring: Optional[PeerRing] = None) -> None:
        """Run agreed ``requests``: fused all-reduces over ``ring`` when given (host tensors),
        everything else over ``comm``."""
        world = group == self._rt.world_group

        def reduce(members: List[Request]) -> None:
            # The world's 16-bit floats keep allreduce_16bit_, which sends 2 bytes an element
            # where the ring sends its float32 partial sums.
            over_ring = (ring is not None and ring_can_carry(members[0])
                         and not (world and members[0].pair[0].dtype in HALF_DTYPES)
                         and self._rt.ring_carries(group, sum(m.nbytes for m in members)))
            self._reduce_fused(ring if over_ring else comm, group, active, members)

        if len(requests) == 1 and requests[0].pair is not None:  # nothing to fuse with
            self._perform(requests, group, lambda: reduce(requests))
            return
        threshold = max(1, self._rt.config.fusion_threshold_bytes)
        i = 0
        while i < len(requests):
            first = requests[i]
            if first.pair is None:
                self._perform([first], group, lambda: first.run(comm, active))
                i += 1
                continue
            j = i
            while j < len(requests) and requests[j].fuse_key == first.fuse_key:
                j += 1
            for chunk in fusion_chunks([r.nbytes for r in requests[i:j]], threshold):
                members = [requests[i + k] for k in chunk]
                self._perform(members, group, lambda m=members: reduce(m))
            i = j

    def _perform(self, requests: List[Request], group, action: Callable[[], None]) -> None:
        """Run the agreed data movement of ``requests``, record it on the timeline under
        their names, and finish their handles (an error is kept for synchronize)."""
        timeline = self._rt.timeline
        start = timeline.now() if timeline.enabled else 0.0
        error = None
        try:
            with self._rt.data_watch.phase(group, f"{requests[0].what} {requests[0].name!r}"):
                action()
        except BaseException as exc:
            error = exc
        if timeline.enabled:
            timeline.complete(requests[0].what, "communication", start, timeline.now() - start,
                              {"group": list(group), "names": [r.name for r in requests],
                               "bytes": sum(r.nbytes for r in requests)})
        self._finish(requests, error)
