"""The worker's side of CASP: one community round per ``step()``.

A round, on every member of the worker's community (``casp.py`` holds the plan logic):

1. P-Reduce (``partial_allreduce``, Sum) of the gradients over the community, together
   with a small float64 vector carrying each member's compute time per step (EMA), a
   leaving flag per member, each member's last reported training loss (NaN: none) and a
   skip flag (a GradScaler found inf/NaN on some member: the round is not applied). The
   gradient is divided by the number of members still training (``communities=
   "auto"``: by the number of workers, so that a community's push weighs as its size).
2. The leader (lowest-numbered member) pushes the averaged gradient once, with the members,
   the times of those still training and the members that are leaving, and pulls the
   parameters once. Server 0's answer carries the current plan of communities.
3. P-Reduce (Sum) of the parameters, the non-leaders contributing zeros: every member gets
   the leader's copy, with the chunk versions, the plan, the servers' count of all pushes
   and an error flag (so a leader that fails makes its whole community raise instead of
   wait).
4. A new plan is adopted by the whole community at once, after this round.

A collective of the script on the whole world (a metric all-reduce after each epoch;
``align()``, run by the runtime before it): members of a community formed by a new plan
may be at different steps (each community adopted the plan at its own round), and the
member ahead would enter the collective while another still needs it for rounds. So the
worker first serves its community's rounds without a gradient, marked paused, until no
member is training and no new plan arrived: every member then enters the collective. Server
0 issues no plan while a worker is paused (from its paused round until it trains again), so
no member in the collective is put in a community that would wait for it. Two collectives
in a row with no step between them pause once.

Uneven work (``leave()``, called by ``join()``): a worker that has finished keeps serving
its community's rounds with zero gradients and its leaving flag set, so members still
training never wait for it. The community stops together, at the first round in which every
member is leaving and no new plan arrived. Server 0 stops regrouping once it hears of a
leaving worker: a plan issued after a worker stopped could otherwise put it in a community
that would wait for it. A round in which every member is leaving pushes nothing to apply
(a skip push), but still tells server 0 who is leaving before anyone stops.

A community of one runs no collective. Both collectives run on the communicator cache of
``ripples.ops`` (the community's ranks in the workers' runtime, which are worker indices).
A member that dies or stalls makes the others' P-Reduce raise ``RipplesTimeoutError``
naming it within the runtime's ``timeout_s``; other communities do not wait for it (unless
a staleness bound makes their pulls wait for its rounds, then their pulls fail after the
servers' timeout).

Parameters without a gradient on a member count as zero in the community's average, and
every chunk is pushed (unlike the other policies, which leave such chunks out).
"""
from __future__ import annotations

import math
import time
from typing import List, NamedTuple

import torch

from .. import runtime
from ..core.errors import RipplesError
from ..ops.partial import grouped_partial_allreduce_
from ..core.reduce_ops import ReduceOp
from . import casp_scoring as casp


class RoundEnd(NamedTuple):
    """How a round ended: members still training (neither leaving nor paused), whether
    every member is leaving, and whether a new plan was adopted after it."""
    training: int
    all_leaving: bool
    new_plan: bool


class CommunityStep:
    """Community rounds for one ``PSOptimizer`` (``policy="casp"``); ``ps`` is its
    ``worker_link.ServerLink``."""

    @staticmethod
    def check_runtime(num_workers: int) -> None:
        """Raise RipplesError unless the runtime's world is the workers (PS mode)."""
        if not runtime.is_initialized() or runtime.current().size != num_workers:
            raise RipplesError("policy='casp' needs ripples initialized in parameter-server "
                               "mode (ripples.torch.init with ps_servers=K): communities "
                               "average gradients with partial_allreduce among the workers")

    def __init__(self, ps):
        self.ps = ps
        spec = ps.spec
        self.num_workers = spec.num_workers
        count = casp.controller_count(spec.communities)
        self.plan_version = 0
        self.plan = casp.contiguous(self.num_workers, count or 1)
        self.time_ema = None
        self.loss = math.nan  # the training loss the loop reported for this step, if any
        self.by_size = casp.weighs_by_size(spec.communities)
        self.last_end = time.monotonic()
        self.rounds = 0
        self.failed = False  # a round raised: the members' collectives are out of step
        self.steps = 0  # training rounds of this worker
        self.paused_at = None  # ``steps`` when the members last paused together
        self.runtime = runtime.current()  # the workers' world (``check_runtime``)
        self.runtime.script_collective_hooks.append(self.align)
        self.stats = {"rounds": 0, "collective_s": 0.0, "plans": [(0, self.plan)],
                      "bytes_pushed_per_community": {}, "bytes_pulled_per_community": {}}

    @property
    def members(self) -> tuple:
        return next(c for c in self.plan if self.ps.worker in c)

    def step(self, skip: bool) -> None:
        """One community round with this worker's gradients."""
        self.time_ema = casp.ema(self.time_ema, time.monotonic() - self.last_end)
        self._round(skip, leaving=False, paused=False)
        self.steps += 1

    def leave(self) -> None:
        """Serve community rounds without gradients until every member of this worker's
        community is leaving too (see the module docstring). After a round failed the
        community is out of step and there is nothing to serve: returns at once."""
        hooks = self.runtime.script_collective_hooks
        if self.align in hooks:
            hooks.remove(self.align)
        while not self.failed:
            end = self._round(False, leaving=True, paused=False)
            if end.all_leaving and not end.new_plan:
                return

    def align(self, group) -> None:
        """Before a collective of the script on ``group``: when it is the whole world,
        serve community rounds without gradients, marked paused, until no member of this
        worker's community is training and no new plan arrived (see the module docstring).
        Returns at once after a failed round, or when the members paused together with no
        step since."""
        if (tuple(group) != self.runtime.world_group or self.failed
                or self.paused_at == self.steps):
            return
        while True:
            end = self._round(False, leaving=False, paused=True)
            if end.training == 0 and not end.new_plan:
                self.paused_at = self.steps
                return

    def _round(self, skip: bool, leaving: bool, paused: bool) -> RoundEnd:
        """One round, with this worker's gradients unless it is leaving or paused."""
        ps = self.ps
        n = self.num_workers
        idle = leaving or paused
        grads = [p.grad.detach() if p.grad is not None and not idle else torch.zeros_like(p)
                 for p in ps.params]
        # times, leaving flags, losses, paused flags, skip
        control = torch.zeros(4 * n + 1, dtype=torch.float64)
        if idle:
            control[(n if leaving else 3 * n) + ps.worker] = 1.0
            control[2 * n + ps.worker] = math.nan
        else:
            control[ps.worker] = self.time_ema
            control[2 * n + ps.worker] = self.loss
            control[-1] = float(skip)
        self.loss = math.nan
        try:
            return self._exchange(grads, control, self.members, idle)
        except RipplesError:
            self.failed = True
            raise

    def _exchange(self, grads, control, members, idle) -> RoundEnd:
        ps = self.ps
        n = self.num_workers
        leader = members[0]
        self._reduce(grads + [control], members, ReduceOp.SUM)
        leavers = [w for w in members if control[n + w] > 0]
        paused = [w for w in members if control[3 * n + w] > 0]
        training = len(members) - len(leavers) - len(paused)
        for g in grads:
            g /= n if self.by_size else max(training, 1)
        error = None
        if ps.worker == leader:
            for p, g in zip(ps.params, grads):
                p.grad = g
            before = (ps.stats_pushed(), ps.stats_pulled())
            try:
                ps.push_and_pull(control[-1].item() > 0 or training == 0, {
                    "members": list(members), "plan": self.plan_version, "leaving": leavers,
                    "paused": paused,
                    "times": {w: float(control[w]) for w in members
                              if w not in leavers and w not in paused},
                    "losses": [v for v in (float(control[2 * n + w]) for w in members)
                               if math.isfinite(v)]})
            except RipplesError as exc:
                error = exc
            self._count_traffic(members, before)
        else:
            ps.clock += 1
        wire = self._broadcast(members, leader, error)
        if not idle:
            self.stats["rounds"] += 1
        self.last_end = time.monotonic()
        if error is not None:
            raise error
        if wire[1] > 0:
            raise RipplesError(f"community {list(members)}: its leader, worker {leader}, failed "
                               f"to push or pull (its own error says why)")
        new_plan = self._adopt(int(wire[0]), [int(v) for v in wire[2:2 + n]])
        return RoundEnd(training, len(leavers) == len(members), new_plan)

    def _reduce(self, tensors: List[torch.Tensor], members: tuple, op) -> None:
        if len(members) > 1:
            began = time.monotonic()
            grouped_partial_allreduce_(tensors, members, op)
            self.stats["collective_s"] += time.monotonic() - began

    def _broadcast(self, members: tuple, leader: int, error):
        """Leader's parameters, versions and plan to every member; returns the control
        vector: [plan version, error flag, plan labels..., chunk versions..., pushes]."""
        ps = self.ps
        cids = [c.cid for c in ps.map.chunks]
        control = torch.zeros(3 + self.num_workers + len(cids), dtype=torch.float64)
        if ps.worker == leader:
            version, labels = ps.last_plan or (self.plan_version,
                                               casp.labels(self.plan, self.num_workers))
            control[0] = version
            control[1] = float(error is not None)
            control[2:2 + self.num_workers] = torch.tensor(labels, dtype=torch.float64)
            control[2 + self.num_workers:-1] = torch.tensor([ps.versions[c] for c in cids],
                                                            dtype=torch.float64)
            control[-1] = ps.total_pushes
        if len(members) == 1:
            return control
        params = [p.data for p in ps.params]
        if ps.worker != leader:
            with torch.no_grad():
                for p in params:
                    p.zero_()
        self._reduce(params + [control], members, ReduceOp.SUM)
        if ps.worker != leader:
            for i, cid in enumerate(cids):
                ps.versions[cid] = int(control[2 + self.num_workers + i])
            ps.total_pushes = int(control[-1])
        return control

    def _adopt(self, version: int, labels: List[int]) -> bool:
        if version <= self.plan_version:
            return False
        self.plan_version = version
        self.plan = casp.from_labels(labels)
        self.stats["plans"].append((version, self.plan))
        return True

    def _count_traffic(self, members: tuple, before) -> None:
        key = ",".join(map(str, members))
        pushed, pulled = self.ps.stats_pushed() - before[0], self.ps.stats_pulled() - before[1]
        per = self.stats["bytes_pushed_per_community"]
        per[key] = per.get(key, 0) + pushed
        per = self.stats["bytes_pulled_per_community"]
        per[key] = per.get(key, 0) + pulled
