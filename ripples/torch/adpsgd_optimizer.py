"""``sync="adpsgd"``: asynchronous, bipartite AD-PSGD (Lian et al., 2018).

Even ranks are active, odd ranks passive. An active rank, after every ``sync_every``-th
local step, picks a passive rank at random (``ripples.schedule.adpsgd.adpsgd_partner``) and
averages its model with it atomically: both end with ``(x_a + x_p) / 2``. A passive rank
never waits for an active one's computation, nor an active one for a passive one's: the
passive answers from a responder thread (``adpsgd_exchange.Responder``) while it computes
its own gradients, on a model that averaging may change under it, as in the paper. Its
optimizer step and the responder's averaging take turns on one lock, so every exchange is
atomic with respect to its local updates; the lock is not held while the tensors travel,
so a step waits for an averaging at most, never for the network. An active rank waits for
its exchange only (and for another active rank's exchange with the same passive, served
first): a slow passive costs its partners at most one exchange, never its compute time.

Transport. A responder thread over point-to-point messages on a private duplicate of the
world communicator, not one-sided MPI: measured here (Open MPI 5.0.11, 2 ranks, the
passive computing 50 ms per step between MPI calls, 100 exchanges), an exchange took 0.9 ms
median with the responder and 40 ms with ``MPI.Win`` passive-target locks (lock, get,
put, unlock) for 40 KB, and 1.6 ms versus 42 ms for 4 MB: Open MPI's one-sided operations
progress only when the target enters MPI, so the active rank waited for the passive's
computation, which is what AD-PSGD must avoid.

The lock-step variant, where an active and its passive meet after the same step (a P-Reduce
of the pair), stays available as ``sync="adpsgd-sync"``: it costs nothing to keep (the
pairing schedule and the decentralized optimizer serve it), the simulator and the earlier
benchmark results model it, and it is the deterministic variant whose runs resume bit for
bit.

Sizes. With ``n`` ranks there are ``ceil(n/2)`` active and ``floor(n/2)`` passive ranks, so
odd sizes work; a world of one rank has no passive rank and trains alone.

Dead ranks (``Config.fault_tolerant``). Only ranks that exchange with a dead one see its
death at once: an active rank whose exchange fails, a passive rank whose responder does
(its wildcard receive fails when any peer dies). That rank's ``Runtime.recover`` revokes
this optimizer's communicator with the others, so every rank's next exchange, or its
responder, fails too, and each survivor recovers at its next ``step()`` (a passive one
learns from its responder there); all of them meet in the shrink. On the smaller world
each survivor keeps its role (active or passive; by the parity of its new rank where only
one role would remain), with a new communicator and responder, and trains on with its
model: an active rank whose exchange was cut short puts back the tensors it had before
it. Lost: the dead rank's progress since its last exchange. Roles are kept because a
passive rank already in ``join()`` that became active would be averaged no more (an
active rank in ``join()`` only tells the passives it has ended), its model left as it was.
"""
from __future__ import annotations

import logging
import threading
from typing import List

import torch
from mpi4py import MPI

from ripples.comm.doorbell import Doorbell
from ripples.core.errors import RanksFailedError, RipplesTimeoutError
from ripples.schedule.adpsgd import adpsgd_partner, adpsgd_roles
from ripples.torch.adpsgd_exchange import Responder, exchange, finish
from ripples.torch.decentralized_optimizer import current_layout, floating_buffers
from ripples.torch.snapshot import Snapshot
from ripples.torch.flat_parameters import FlatParameters
from ripples.torch.lockstep_watch import LockstepWatch
from ripples.torch.optimizer_base import WrappedOptimizer
from ripples.torch.ownership import record
from ripples.torch.replicas import ReplicaCheck

log = logging.getLogger("ripples")


class AdpsgdOptimizer(WrappedOptimizer):
    """Local steps, with asynchronous pairwise averaging between active and passive ranks.

    The averaged tensors (the parameters of ``named``, then ``model``'s floating buffers)
    live in flat buffers (``FlatParameters``, as in ``DecentralizedOptimizer``), so an
    exchange sends one contiguous buffer per dtype each way; optimizer state stays local.

    Contract:

    - Construction is collective (it duplicates the world communicator). A passive rank
      starts answering at its first ``step()`` (or at ``join()``/``close()``), so the model
      may be loaded (``load_state_dict``) between construction and the first step; until
      then active ranks that picked it wait for it.
    - ``step()``: the local step; on an active rank, every ``sync_every`` steps, one
      exchange. A passive rank's parameters change between its steps whenever an active
      rank averages with it. With a ``closure``, the passive answers no exchange while the
      closure runs (it runs inside the step).
    - ``join()`` (``hvd.join``) and ``close()`` work with any step counts: an active rank
      tells every passive rank it has ended; a passive rank keeps answering until every
      active rank has ended, waiting at most ``Config.timeout_s`` after the last sign of
      life of the active ranks it still waits for (``RipplesTimeoutError`` names them).
      An active rank whose partner does not answer within ``Config.timeout_s`` raises
      ``RipplesTimeoutError`` naming it. After ``join()`` on every rank no exchange is in
      flight and no message is left unmatched.
    - ``state_dict()`` holds the optimizer state plus the step and exchange counters; a
      resumed run draws the same partners, but as exchanges land on a passive rank at
      moments that depend on timing, it does not repeat an uninterrupted run bit for bit.

    ``exchanges``: exchanges this rank took part in (started, on an active rank; served,
    on a passive one). ``active``: this rank's role.
    """

    def __init__(self, optimizer, named, mode, sync_every: int, model):
        super().__init__(optimizer, named)
        rt = self._runtime
        self.mode = mode
        self.exchanges = 0
        self._model = model
        self.replicas = ReplicaCheck(model, self._runtime.rank, self._runtime.size,
                                     mode.value)
        self._buffers = floating_buffers(model)
        self.flat = FlatParameters(list(named) + self._buffers)
        self._sync_every = sync_every
        self._lock = threading.Lock()
        self._snapshot = Snapshot()
        self._left = False
        self._left_generation = None  # the world in which leave() completed
        self._watch = None  # a passive rank in join(): its check on the active ranks' end
        self._closed = False
        self._join_world(start=False)
        rt.uneven_steps.add(self)  # an exchange never waits for a passive rank's step
        self._lockstep_watch = LockstepWatch(rt, mode.value)
        rt.join_hooks.append(self._start_leaving)
        rt.joined_hooks.append(self._end_leaving)
        rt.join_poll_hooks.append(self._watch_actives)
        rt.abandon_hooks.append(self._abandon_world)
        rt.rebuild_hooks.append(self._new_world)
        rt.at_shutdown(self.close)
        record(self, named, self.close)

    def _join_world(self, start: bool, keep_roles: bool = False) -> None:
        """This rank's role, communicator and (passive) responder in the current world
        (collective: it duplicates the world communicator). ``keep_roles``: on the
        survivors' world, every rank keeps the role it had (``adpsgd_roles``)."""
        rt = self._runtime
        was_active = rt.world.allgather(self.active) if keep_roles else None
        actives, self._passives = adpsgd_roles(rt.size, was_active)
        self.active = rt.rank in actives
        self._generation = rt.generation
        self._comm = rt.world.Dup()
        self._doorbell = Doorbell.setup_many(self._comm, self._passives)
        self._actives = actives
        self._responder = None
        if not self.active:
            self._responder = self._new_responder()
            if start:
                self._responder.start()

    def _new_responder(self) -> Responder:
        rt = self._runtime
        return Responder(self._comm, rt.rank, self._actives, self._lock, self._tensors,
                         self._served, rt.config.timeout_s, rt.config.stall_warning_s,
                         rt.liveness, self._doorbell)

    def _abandon_world(self) -> None:
        """Ranks died: revoke the exchanges' communicator (ranks waiting in it stop) and
        stop the responder, without talking to anyone."""
        from ripples.comm.failures import revoke
        revoke([self._comm])
        if self._responder is not None:
            self._responder.stop()

    def _new_world(self) -> None:
        """The survivors are on a smaller world: keep this rank's role there (collective
        over them, called by ``Runtime.recover`` on every survivor in the same order)."""
        old, old_doorbell = self._comm, self._doorbell
        self._join_world(start=True, keep_roles=True)
        if old_doorbell is not None:
            old_doorbell.close()
        try:
            old.Free()
        except MPI.Exception:  # revoked: nothing to release on the survivors' side
            pass

    def _recover_from(self, error: BaseException, what: str) -> None:
        """Raise ``error`` unless it is a dead or silent peer's; then recover (collective
        over the survivors) and log what was lost."""
        rt = self._runtime
        rank = rt.rank  # the ranks in ``what`` are of the world that lost it
        not_asked_yet = type(error) is RipplesTimeoutError  # a PeersSilentError was
        if not_asked_yet and error.missing and rt.config.fault_tolerant:
            # A peer that stopped answering mid-exchange (the responder's thread cannot ask):
            # silent (cut off, frozen) is survived like dead; alive, the error stands.
            try:
                rt.liveness.keep_waiting(error.missing, error)
            except RipplesTimeoutError as found:  # PeersSilentError: silent, recovered from
                error = found
        failure = rt.raised(error, self._generation)
        if failure is error:
            raise error
        if not isinstance(failure, RanksFailedError):
            raise failure from error
        log.warning("rank %d: %s was lost (%s); training goes on with this rank's model",
                    rank, what, failure)

    def step(self, closure=None):
        """The wrapped optimizer's step; then, on an active rank when one is due, an
        exchange with a random passive rank (waits for that exchange only). A step after
        ``join()`` takes part again, as in Horovod (the join ended when every rank had
        joined: every exchange of the last round was served)."""
        if self._left:
            self._rejoin()
        if self._responder is not None and self._responder.error is not None:
            self._recover_from(self._responder.error, "an exchange this passive rank served")
        if self._responder is not None:
            self._responder.start()
        self._finish_compute()
        with self.metrics.waiting():  # a passive may wait for one exchange in progress
            self._lock.acquire()
        try:
            self._check_layout()
            result = self.optimizer.step(closure)
        finally:
            self._lock.release()
        if self.active and (self._steps + 1) % self._sync_every == 0:
            self._exchange()
        self._end_step()
        self.replicas.stepped()
        self._lockstep_watch.stepped()
        return result

    def _exchange(self) -> None:
        rt = self._runtime
        partner = adpsgd_partner(rt.config.seed, rt.rank, self.exchanges, rt.size,
                                 self._passives)
        if partner is None:  # a world of one: nobody to average with
            return
        tensors = self._tensors()
        if rt.config.fault_tolerant:  # an exchange cut short may leave them half written
            self._snapshot.save(tensors)
        try:
            with self.metrics.waiting():
                exchange(self._comm, rt.rank, partner, tensors, self.exchanges,
                         rt.config.timeout_s, rt.config.stall_warning_s, self._doorbell,
                         rt.liveness)
        except Exception as error:  # noqa: BLE001 - only a dead peer's is absorbed
            self._recover_from(error, f"exchange {self.exchanges} with rank {partner}")
            self._snapshot.restore(tensors)
            return
        self.exchanges += 1
        self.metrics.add_group(2)

    def _rejoin(self) -> None:
        if self._closed:
            raise RuntimeError(f"rank {self._runtime.rank} called step() after close()")
        self._left = False
        self._left_generation = None
        if not self.active:  # the last responder ended with every active rank's DONE
            self._responder = self._new_responder()

    def _served(self, active: int) -> None:
        self.exchanges += 1
        self.metrics.add_group(2)

    def _tensors(self) -> List[torch.Tensor]:
        """What an exchange averages: the flat buffers, then the loose tensors."""
        return list(self.flat.buffers) + [t.detach() for t in self.flat.loose]

    def _check_layout(self) -> None:
        """Lay the buffers out again if a tensor left its place (called under the lock)."""
        self.flat, self._buffers = current_layout(self.flat, self._named, self._model,
                                                  self._buffers, self._runtime.rank)

    def extra_state(self) -> dict:
        state = super().extra_state()
        state["syncs"] = self.exchanges
        return state

    def load_extra_state(self, extra: dict) -> None:
        super().load_extra_state(extra)
        self.exchanges = int(extra.get("syncs", 0))

    def leave(self) -> None:
        """Stop training on this rank. An active rank tells the passive ranks; a passive
        rank answers until every active rank has ended (see the class contract). After
        ranks died, ``join()`` calls it again, to leave the survivors' world too."""
        self._start_leaving()
        self._end_leaving()

    def _start_leaving(self) -> None:
        """``join()``'s first half: an active rank tells the passive ranks it has ended."""
        rt = self._runtime
        if self._left_generation == rt.generation:
            return
        self._left = True
        if self.active:
            finish(self._comm, rt.rank, self._passives, self.exchanges, rt.config.timeout_s,
                   rt.config.stall_warning_s, self._doorbell)
            self._left_generation = rt.generation
        else:  # the join's rounds watch the active ranks as the end's wait would
            self._responder.start()
            self._watch = self._responder.watch()

    def _watch_actives(self) -> None:
        if self._watch is not None:
            self._watch()

    def _end_leaving(self) -> None:
        """``join()``'s second half, once every rank has joined: a passive rank waits until
        its responder has answered every active rank's end (each active told it before
        joining, so this wait is short)."""
        rt = self._runtime
        if self._left_generation == rt.generation:
            return
        self._watch = None
        if not self.active:
            self._responder.wait()
        self._left_generation = rt.generation

    def close(self) -> None:
        """Leave (as ``join()`` does), free the communicator, and drop out of ``join()``
        and ``shutdown()``. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        rt = self._runtime
        try:
            self.leave()
        finally:
            if self._responder is not None:
                self._responder.stop()
            if self._doorbell is not None:
                self._doorbell.close()
            self._comm.Free()
            self.replicas.close()
            self._lockstep_watch.close()
            rt.uneven_steps.discard(self)
            for hooks, hook in ((rt.join_hooks, self._start_leaving),
                                (rt.joined_hooks, self._end_leaving),
                                (rt.join_poll_hooks, self._watch_actives),
                                (rt.abandon_hooks, self._abandon_world),
                                (rt.rebuild_hooks, self._new_world)):
                if hook in hooks:
                    hooks.remove(hook)
            rt.cancel_at_shutdown(self.close)
