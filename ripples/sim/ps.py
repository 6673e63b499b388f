"""The parameter-server modes of the simulator (``ps-<policy>``): workers push gradients to
servers and pull parameters back, under the real policy logic of ``sync="ps"``.

What runs the real code: :class:`ripples.ps.policies.Rounds` closes BSP and Sync-opt
rounds, :func:`~ripples.ps.policies.pull_ready` decides when a pull is answered (the SSP
and CASP staleness gates), :func:`~ripples.ps.policies.apply_factor` scales each update
(DynSGD, ConSGD), and CASP's communities come from :class:`ripples.ps.casp.Controller`
(``observe``/``regroup``: sort-and-cut on the measured speeds, every ``regroup_every``
rounds).

The model:

* a worker computes a gradient at the parameters it last pulled, pushes it, waits for its
  pull to be answered (the policy's gate), receives the parameters and computes again;
* the model is split evenly over ``ps_servers`` servers, each behind one inter-node link
  per direction, which carries one shard at a time, first come first served; a worker's
  own link carries the whole model (``Network.inter`` for both, plus ``overhead_s`` once);
* the servers' model is one vector trained by SGD with momentum (:class:`.stats.Server`);
  a BSP or Sync-opt round applies the mean of its gradients, other policies apply each
  push on arrival with the policy's factor (``ps-asp``/``ps-ssp`` also with
  ``push_lr_scale``);
* CASP: with ``communities="auto"`` a push is scaled by its community's size over the
  number of workers, and carries its leader's loss on a slice of the test set;
* CASP: a community's members average their gradients with a P-Reduce (the network's
  all-reduce among them), the lowest member pushes it, and the community pulls once: the
  leader's pull, then a broadcast costed as half that all-reduce. Members adopt the newest
  plan with that pull.

Evaluation: the "averaged model" is the servers' model; worker 0's model is its last pull.
"""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..ps import casp
from ..ps.policies import PolicySpec, Rounds, ROUND_POLICIES, apply_factor, pull_ready
from .loop import EventLoop
from .scenario import Scenario
from .stats import Server

PER_PUSH_SCALED = ("asp", "ssp", "eager")  # policies whose learning rate push_lr_scale divides


class ParameterServerRun(EventLoop):
    """One ``ps-<policy>`` run; see the module docstring."""

    def __init__(self, scenario: Scenario, progress):
        super().__init__(scenario, progress)
        s, n = scenario, scenario.workers
        self.spec: PolicySpec = s.policy_spec()
        self.policy = self.spec.name
        self.server = Server(s.problem)
        self.scale = 1.0
        if self.policy in PER_PUSH_SCALED:
            self.scale = s.push_lr_scale if s.push_lr_scale is not None else 1.0 / n
        elif self.policy == "casp" and s.push_lr_scale is not None:
            self.scale = s.push_lr_scale
        # communities="auto" weighs each push by its community's size (casp_progress)
        self.by_size = self.policy == "casp" and casp.weighs_by_size(self.spec.communities)
        self.rounds = Rounds(self.spec.quorum) if self.policy in ROUND_POLICIES else None
        self.everyone = set(range(n))
        self.round_gradients: Dict[int, Dict[int, np.ndarray]] = collections.defaultdict(dict)
        self.clock_of = [0] * n  # the round a worker's next push belongs to
        self.pushes = [0] * n
        self.pushes_at = collections.Counter({0: n})  # how many workers have pushed k times
        self.slowest = 0
        self.computed_on = [0] * n
        self.waiting: Dict[Tuple[int, ...], int] = {}  # pull not yet answered -> its round
        self.links_in = [0.0] * s.ps_servers
        self.links_out = [0.0] * s.ps_servers
        self.dropped = 0
        self.controller: Optional[casp.Controller] = None
        if self.policy == "casp":
            count = casp.controller_count(self.spec.communities)
            self.controller = casp.Controller(n, count, self.spec.regroup_every)
            self.community = {w: (0, c) for c in self.controller.plan for w in c}
            self.times: Dict[int, float] = {}

    def start(self) -> None:
        for w in range(self.s.workers):
            self.begin_step(w)

    def handlers(self) -> dict:
        return {"computed": self.computed, "pushed": self.pushed, "pulled": self.pulled,
                "reduced": self.reduced}

    def begin_step(self, w: int) -> None:
        self.evaluate_if_due(w)
        self.start_compute(w)

    # -- transfers -----------------------------------------------------------------
    def transfer(self, links: List[float]) -> float:
        """When moving the model between one worker and the servers ends, if it starts now:
        each shard waits for its server's link, the worker's link carries all of it."""
        net, now = self.s.network, self.clock.now
        link, nbytes = net.inter, self.s.model_bytes
        shard_s = nbytes / len(links) / link.bandwidth_Bps
        end = now + link.latency_s + nbytes / link.bandwidth_Bps
        for i, free in enumerate(links):
            links[i] = max(now, free) + shard_s
            end = max(end, links[i] + link.latency_s)
        return end + net.overhead_s

    # -- workers -------------------------------------------------------------------
    def computed(self, w: int) -> None:
        self.step_ended(w)
        gradient = self.stats.gradient(w)
        if self.controller is None:
            clock = self.clock_of[w]
            self.clock_of[w] += 1
            self.push(self.transfer(self.links_in), "pushed", (w,), gradient,
                      self.computed_on[w], clock)
            return
        self.times[w] = casp.ema(self.times.get(w), self.last_compute[w])
        key = self.community[w]
        self.round_gradients[key][w] = gradient
        if len(self.round_gradients[key]) == len(key[1]):  # the last member arrived
            network = self.s.network
            parts = network.allreduce_parts(self.s.model_bytes, len(key[1]),
                                            max(len(network.nodes(key[1])), 1))
            self.start_collective(key[1], parts, "reduced", key)

    def reduced(self, key: tuple) -> None:
        """A CASP community's P-Reduce ended: its leader pushes the mean."""
        gradients = self.round_gradients.pop(key)
        mean = np.mean([gradients[m] for m in key[1]], axis=0)
        leader = key[1][0]
        self.push(self.transfer(self.links_in), "pushed", key[1], mean,
                  self.computed_on[leader], key[0])

    def pushed(self, members: Tuple[int, ...], gradient: np.ndarray, computed_on: int,
               clock: int) -> None:
        """A push reached every server: apply it as the policy says, then ask to pull.
        ``clock``: the round of a BSP or Sync-opt push, the plan version of a CASP one."""
        for w in members:
            self.count_push(w)
        if self.rounds is not None:
            (w,) = members
            if self.rounds.offer(w, clock):
                self.round_gradients[clock][w] = gradient
                self.close_rounds()
            else:  # Sync-opt: its round closed without it; it resumes at the current one
                self.dropped += 1
                self.clock_of[w] = self.rounds.applied
        else:
            delay = self.server.version - computed_on
            size = len(members) / self.s.workers if self.by_size else 1.0
            self.apply([gradient], apply_factor(self.spec, delay, 1.0) * self.scale * size,
                       len(members))
            if self.controller is not None:
                losses = [self.probe_loss(members[0])] * len(members) if self.by_size else ()
                casp.observe(self.controller, clock, members,
                             {m: self.times[m] for m in members}, losses, self.clock.now)
                casp.regroup(self.controller)
        self.waiting[members] = self.clock_of[members[0]]
        self.answer_pulls()

    def close_rounds(self) -> None:
        while self.rounds.ready(self.everyone):
            clock = self.rounds.applied
            members, late = self.rounds.close()
            gradients = self.round_gradients.pop(clock)
            self.dropped += len(late)
            self.apply([gradients[w] for w in members], 1.0, len(members))

    def apply(self, gradients: Sequence[np.ndarray], scale: float, members: int) -> None:
        self.server.apply(np.mean(gradients, axis=0), scale)
        self.groups += 1
        self.group_members += members

    def count_push(self, w: int) -> None:
        self.pushes_at[self.pushes[w]] -= 1
        self.pushes[w] += 1
        self.pushes_at[self.pushes[w]] += 1
        while self.pushes_at[self.slowest] == 0:
            self.slowest += 1

    def answer_pulls(self) -> None:
        """Answer every waiting pull the policy lets through; the parameters leave now."""
        applied = self.rounds.applied if self.rounds is not None else 0
        for members, after_round in list(self.waiting.items()):
            own = self.pushes[members[0]]
            if not pull_ready(self.spec, after_round, applied, own, (self.slowest,)):
                continue
            del self.waiting[members]
            end = self.transfer(self.links_out)
            if len(members) > 1:  # a community: the leader's pull, then a broadcast
                nodes = self.s.network.nodes(members)
                end += self.s.network.allreduce_s(self.s.model_bytes, len(members),
                                                  len(nodes)) / 2
            self.push(end, "pulled", members, self.server.params.copy(), self.server.version)

    def pulled(self, members: Tuple[int, ...], params: np.ndarray, version: int) -> None:
        for w in members:
            self.stats.params[w] = params
            self.computed_on[w] = version
            if self.controller is not None:  # adopt the newest plan
                self.community[w] = (self.controller.version,
                                     next(c for c in self.controller.plan if w in c))
        for w in members:
            self.begin_step(w)

    # -- measurement ---------------------------------------------------------------
    def probe_loss(self, w: int) -> float:
        """The loss worker ``w`` reports with a push: its model's loss on the first 256
        test samples (the mini-batch loss a real worker reports, with less noise)."""
        data = self.stats.data
        z = data.x_test[:256] @ self.stats.params[w]
        return float((np.logaddexp(0, z) - data.y_test[:256] * z).mean())

    def measure(self) -> tuple:
        return (float(self.stats.data.loss(self.server.params)[0]), self.stats.loss(0),
                self.stats.consensus_distance())
