"""Alpha-beta cost of the collectives a schedule runs, on a two-level topology.

Workers are placed ``workers_per_node`` per node, in rank order. A message of ``b`` bytes
over a link costs ``latency + b / bandwidth``. A collective among ``g`` members spanning
``k`` nodes uses the intra-node link if ``k == 1`` and otherwise is bound by the
inter-node link (a ring or tree ordered by node crosses each node boundary once per
direction, so every step of it waits for one inter-node transfer):

* ring all-reduce: ``2 (g - 1)`` steps of ``b / g`` bytes (reduce-scatter + all-gather);
* tree all-reduce: ``2 ceil(log2 g)`` latencies plus ``2 b / bandwidth`` (reduce then
  broadcast, pipelined in chunks so the bytes cross each link about twice);
* a P-Reduce of a group is the same all-reduce over the group's members;
* a collective of two members on two nodes may have its own inter-node bandwidth
  (``inter_pair_Bps``): a pair is one exchange in both directions at once, where a larger
  group's all-reduce, as an MPI library runs it, may reach less of the link (measured apart
  by ``benchmarks/link.py``);
* an AD-PSGD exchange sends the whole model from the active worker to the passive one and
  the passive one's back: two messages of ``b`` bytes, one after the other, plus
  ``exchange_overhead_s`` once (its software cost: the passive's responder thread noticing
  the request, the averaging; measured by ``benchmarks/latency_after_idle.py``). An
  exchange does not pass through the engine, so it does not pay ``overhead_s``;
* every collective also pays ``overhead_s`` once (the software cost of launching it,
  measured for ripples by ``benchmarks/collectives.py`` back to back and by
  ``benchmarks/latency_after_idle.py`` after a step of compute);
* a request to the Group Generator service pays ``service_s`` once beyond its two
  messages (the doorbell, the service thread's wake-up and the client's poll, measured by
  ``benchmarks/latency_after_idle.py``); with ``service_jitter`` each request's cost is
  ``service_s * exp(service_jitter * z)``, ``z`` standard normal (``service_s`` its
  median): across hosts, beside 20 MB collectives, the real costs spread with a 90th
  percentile about 2.7 times their median (``request_cost_ms`` of ``benchmarks/train.py``).
* the members of a collective do not leave it together: with ``exit_early`` every member
  draws ``x`` from an exponential of mean ``exit_early`` and leaves ``d * (x - min x)``
  before the last one, ``d`` the collective's duration to its last member (the cost
  above). Across hosts, 20 MB P-Reduces of 2, 3 and 4 members of which all ran at once
  left the earlier members 5.0% of the duration before the last (median; mean 6.5%, alike
  for every size, spread about as an exponential: ``benchmarks/exit_spread.py``).

Contention: every node has one inter-node link (NIC), shared by the collectives that
cross it (the simulation's loop applies it: ``EventLoop.start_collective``), in one of two
ways (``link_sharing``):

* ``"fixed"`` (the default): a collective's inter-node bandwidth is divided by the most
  multi-node collectives in flight on any of its nodes when it starts, itself included,
  for its whole duration; the share is not revised when others start or end.
* ``"fair"``: its bytes (``wire_s`` of ``allreduce_parts``) move at ``1 / k`` of their own
  pace, ``k`` the most collectives crossing any of its nodes at that moment, revised
  whenever one starts or ends; its software cost and latencies (``fixed_s``) do not hold
  the links. Identical workers then finish in exact ties, which the fixed shares break by
  start order: use it with some per-step spread (``Speed.jitter``).

``allreduce_s`` with ``sharing`` is the cost under a share that stays the same
throughout. Intra-node links are not shared.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence, Tuple

ALGORITHMS = ("ring", "tree")
LINK_SHARING = ("fixed", "fair")


@dataclasses.dataclass(frozen=True)
class Link:
    """One link: ``latency_s`` per message, ``bandwidth_Bps`` bytes per second."""
    latency_s: float
    bandwidth_Bps: float

    def __post_init__(self):
        if not self.latency_s >= 0 or not self.bandwidth_Bps > 0:
            raise ValueError(f"a link needs latency_s >= 0 and bandwidth_Bps > 0, got {self}")


@dataclasses.dataclass(frozen=True)
class Network:
    """Topology and links; see the module docstring for the cost model."""
    workers_per_node: int = 1
    intra: Link = Link(5e-6, 300e9)  # NVLink-class
    inter: Link = Link(5e-6, 12.5e9)  # 100 Gb/s
    algorithm: str = "ring"
    overhead_s: float = 0.0
    service_s: float = 0.0
    service_jitter: float = 0.0
    exit_early: float = 0.0
    exchange_overhead_s: float = 0.0
    inter_pair_Bps: Optional[float] = None  # None: the inter link's bandwidth
    link_sharing: str = "fixed"  # or "fair" (see the module docstring)

    def __post_init__(self):
        if self.workers_per_node < 1:
            raise ValueError(f"workers_per_node must be >= 1, got {self.workers_per_node!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        for name in ("overhead_s", "service_s", "service_jitter", "exit_early",
                     "exchange_overhead_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.link_sharing not in LINK_SHARING:
            raise ValueError(f"link_sharing must be one of {LINK_SHARING}, "
                             f"got {self.link_sharing!r}")
        if self.inter_pair_Bps is not None and not self.inter_pair_Bps > 0:
            raise ValueError(f"inter_pair_Bps must be > 0 or None, got {self.inter_pair_Bps!r}")

    def node(self, worker: int) -> int:
        return worker // self.workers_per_node

    def nodes(self, members: Sequence[int]) -> set:
        """The nodes a group of workers spans."""
        if self.workers_per_node == 1:
            return set(members)
        return {w // self.workers_per_node for w in members}

    def allreduce_s(self, nbytes: float, members: int, nodes: int, sharing: int = 1) -> float:
        """Seconds of an all-reduce of ``nbytes`` among ``members`` workers on ``nodes``
        nodes whose inter-node links are each shared by ``sharing`` collectives throughout."""
        fixed, wire = self.allreduce_parts(nbytes, members, nodes)
        return fixed + wire * (1 if nodes <= 1 else max(sharing, 1))

    def allreduce_parts(self, nbytes: float, members: int, nodes: int) -> Tuple[float, float]:
        """An all-reduce's cost in two parts: ``(fixed_s, wire_s)``, the software cost and
        latencies, and the seconds its bytes take at a whole share of the links (the part
        that other collectives crossing the same nodes slow down)."""
        if members <= 1:
            return 0.0, 0.0
        link = self.intra if nodes <= 1 else self.inter
        bandwidth = link.bandwidth_Bps
        if nodes > 1 and members == 2 and self.inter_pair_Bps is not None:
            bandwidth = self.inter_pair_Bps
        if self.algorithm == "ring":
            steps = 2 * (members - 1)
            return self.overhead_s + steps * link.latency_s, steps * nbytes / members / bandwidth
        return (self.overhead_s + 2 * math.ceil(math.log2(members)) * link.latency_s,
                2 * nbytes / bandwidth)

    def exchange_s(self, nbytes: float, nodes: int, sharing: int = 1) -> float:
        """Seconds of an AD-PSGD exchange of ``nbytes`` between two workers on ``nodes``
        nodes (1 or 2) whose inter-node links are each shared by ``sharing`` transfers
        throughout."""
        fixed, wire = self.exchange_parts(nbytes, nodes)
        return fixed + wire * (1 if nodes <= 1 else max(sharing, 1))

    def exchange_parts(self, nbytes: float, nodes: int) -> Tuple[float, float]:
        """An AD-PSGD exchange's cost as ``(fixed_s, wire_s)`` (see ``allreduce_parts``)."""
        link = self.intra if nodes <= 1 else self.inter
        return self.exchange_overhead_s + 2 * link.latency_s, 2 * nbytes / link.bandwidth_Bps

    def message_s(self, nbytes: float, a: int, b: int) -> float:
        """One point-to-point message between workers ``a`` and ``b`` (e.g. to the
        Group Generator on worker 0)."""
        link = self.intra if self.node(a) == self.node(b) else self.inter
        return link.latency_s + nbytes / link.bandwidth_Bps
