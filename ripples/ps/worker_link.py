"""A worker's connection to the servers of one PSOptimizer session (``ServerLink``): pushes,
pulls, and what the answers say (chunk versions, rounds applied, the chunk map).

The policy steps (``steps``, ``community``, ``epsp``), checkpoints (``checkpoint``) and
chunk moves (``chunk_moves``) all talk to the servers through it.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from . import chunk_moves
from .hyperparams import SentGroups, snapshot
from .transport import pack, state_to_wire, to_wire, unpack


class ServerLink:
    """What one worker knows of the servers, and the messages it sends them.

    ``map``: the chunk map in use; ``versions``: per chunk, the updates applied to the
    parameters this worker holds; ``clock``: this worker's pushes (rounds, for community and
    task policies); ``rounds_known``/``total_pushes``: rounds applied and pushes of all
    workers as of the latest answers; ``pending_pull``: a pull asked and not installed yet
    (the eager policy), by server; ``stats``: the worker's counters (``PSOptimizer.metrics``).
    ``balancer``: PSLD's ``balancer.Balancer`` when it runs: pushes carry its profile and
    it hears of every new map.
    """

    def __init__(self, context, sid: int, optimizer, setup):
        self.channel = context.channel
        self.worker = context.worker
        self.sid = sid
        self.optimizer = optimizer
        self.spec = setup.spec
        self.params: List[torch.Tensor] = setup.params
        self.timeout_s = setup.timeout_s
        self.servers = list(range(context.num_servers))
        self.map = setup.map
        self.server_chunks = {s: self.map.chunks_of(s) for s in self.servers}
        self.versions: Dict[int, int] = {c.cid: 0 for c in self.map.chunks}
        self.newest: Dict[int, int] = {s: 0 for s in self.servers}
        self.applied_mine: Dict[int, int] = {s: 0 for s in self.servers}
        self.clock = 0
        self.pushes = 0
        self.pending_pull: Optional[Dict[int, int]] = None
        self.rounds_known = 0  # rounds (clocks) applied, as the latest answer said
        self.total_pushes = 0  # pushes of all workers, as of the last pull (a CASP round
        # counts once per member): the servers' view of global progress in worker steps
        self.last_plan = None
        self.last_profiles: Dict[int, Dict[int, float]] = {}
        self.sent_groups = SentGroups()
        self.balancer = None
        self.stats = {"steps": 0, "bytes_pushed_per_server": [0] * len(self.servers),
                      "bytes_pulled_per_server": [0] * len(self.servers), "time_blocked_s": 0.0,
                      "expected_tau_hist": {}, "gate_log": [], "blocked_by_max_lag": 0,
                      "redirects": 0, "map_versions": []}

    # -- sending -------------------------------------------------------------------------
    def members(self) -> List[int]:
        """The servers this worker pushes to and pulls from under its current map."""
        return list(self.map.members)

    def push(self, factor: float, skip: bool = False, grads=None, extra=None,
             advance=True) -> None:
        """Push ``grads`` (default: the parameters' ``.grad``) with ``extra`` message fields
        to every member server; ``advance``: count the push and move the clock on."""
        hyper = self.sent_groups.changed(self.optimizer.param_groups)
        sources = [p.grad for p in self.params] if grads is None else grads
        pool = self.channel.pool
        for server in self.members():
            sent, tensors, seen = [], [], {}
            for c in self.server_chunks[server]:
                grad = sources[c.param]
                # No gradient (frozen or unused here) is left out: the servers' optimizer
                # then skips the chunk, as torch skips a parameter whose grad is None.
                if not skip and grad is not None:
                    sent.append(c.cid)
                    tensors.append(grad.detach().reshape(-1)[c.start:c.stop]
                                   .to(self.params[c.param].dtype))
                seen[c.cid] = self.versions[c.cid]
            payload = pack(pool, tensors)
            self.stats["bytes_pushed_per_server"][server] += payload.nbytes
            message = {"kind": "push", "sid": self.sid, "w": self.worker, "clock": self.clock,
                       "chunks": sent, "computed_on": seen, "factor": factor,
                       "map": self.map.version}
            if hyper is not None:
                message["hyper"] = hyper
            if self.balancer is not None:
                message["prof"] = self.balancer.profile()
            if skip:
                message["skip"] = True
            message.update(extra or {})
            self.channel.send(server, message, payload, lambda b=payload: pool.give(b))
        if advance:
            self.pushes += 1
            self.clock += 1

    def push_and_pull(self, skip: bool, extra: dict) -> None:
        """Push the parameters' ``.grad`` with ``extra`` message fields, then pull."""
        self.push(1.0, skip, extra=extra)
        self.pull_now()

    def push_sums(self, sums: List[Optional[torch.Tensor]], extra: dict, skip: bool) -> None:
        """Push ``sums`` (one tensor or None per parameter) with ``extra`` message fields,
        without advancing the clock."""
        self.push(1.0, skip, grads=sums, extra=extra, advance=False)

    def request_pull(self, after: Optional[int] = None, servers=None) -> Dict[int, int]:
        """Ask ``servers`` (default: the members) for their parameters once the gate lets
        clock ``after`` (default: this worker's clock) start; returns the request ids."""
        after = self.clock if after is None else after
        return {s: self.channel.send(s, {"kind": "pull", "sid": self.sid, "w": self.worker,
                                         "after": after, "map": self.map.version})
                for s in (self.members() if servers is None else servers)}

    def ask_all(self, kind: str, what: str) -> Dict[int, dict]:
        """Send a ``kind`` request (``join``, ``stats``, ``state``) to every server and wait
        for the answers, by server (``what`` names the wait in a timeout)."""
        rids = {s: self.channel.send(s, {"kind": kind, "sid": self.sid, "w": self.worker})
                for s in self.servers}
        return self.wait_all(rids, what, count_blocked=False)

    def chunk_wires(self, server: int, optimizer):
        """``(chunk, parameter slice, optimizer state)`` on the wire for every chunk that
        ``server`` owns, from this worker's parameters and ``optimizer``'s state."""
        out = []
        for c in self.server_chunks[server]:
            p = self.params[c.param]
            out.append((c, to_wire(p.data.view(-1)[c.start:c.stop], copy=True),
                        state_to_wire(optimizer.state.get(p, {}), p.shape, c.start, c.stop)))
        return out

    def send_init(self, optimizer, groups: List[int], link_delay_s: float) -> None:
        """Worker 0: start the session on every server with its chunks (``groups``: every
        parameter's group index) and ``optimizer``'s class, values and state."""
        hyper = snapshot(optimizer.param_groups)
        for server in self.servers:
            wires = self.chunk_wires(server, optimizer)
            self.channel.send(server, {
                "kind": "init", "sid": self.sid, "w": self.worker,
                "chunks": [(c.cid, groups[c.param], array) for c, array, _ in wires],
                "state": {c.cid: state for c, _, state in wires},
                "opt_class": type(optimizer), "defaults": dict(optimizer.defaults),
                "groups": hyper, "spec": self.spec, "link_delay_s": link_delay_s,
                "map_version": self.map.version, "owners": self.map.owners,
                "active": self.map.members, "timeout_s": self.timeout_s})

    # -- answers -------------------------------------------------------------------------
    def wait_all(self, rids: Dict[int, int], what: str, count_blocked=True) -> Dict[int, dict]:
        """The answers to ``rids`` (by server); ``what`` names the wait in a timeout."""
        began = time.monotonic()
        answers = {s: self.channel.wait(s, rid, 2 * self.timeout_s, f"worker {self.worker} {what}")
                   for s, rid in rids.items()}
        if count_blocked:
            self.stats["time_blocked_s"] += time.monotonic() - began
        return answers

    def pull_now(self) -> None:
        """Pull after this worker's clock and install the answer (blocking)."""
        self.install_pull(self.request_pull())

    def install_pull(self, rids: Dict[int, int]) -> None:
        """Wait for the pull asked as ``rids`` and install its answer."""
        self.install_all(self.wait_all(rids, f"pull after step {self.clock}"))

    def settle(self, what: str) -> None:
        """Install the pull still in flight, if any (before a join or a load)."""
        if self.pending_pull:
            self.install_all(self.wait_all(self.pending_pull, what, count_blocked=False))
            self.pending_pull = None

    def install_all(self, answers: Dict[int, dict]) -> None:
        """Install pull answers, adopting a newer chunk map (and pulling what moved)."""
        installed = set()
        for server, answer in answers.items():
            self.install(server, answer)
            installed.update(answer["chunks"])
            if "profiles" in answer:
                self.last_profiles = answer["profiles"]
        newest = max(answers.values(), key=lambda a: a.get("map", 0))
        if newest.get("map", 0) > self.map.version:
            chunk_moves.adopt_map(self, newest)
            chunk_moves.redirect(self, installed, answers)
        first = answers[min(answers)]
        if "plan" in first:
            self.last_plan = first["plan"]
        self.total_pushes = max(self.total_pushes, first.get("total_pushes", 0))
        if "min_pushes" in first:
            self.stats["gate_log"].append((first["pushes"], first["min_pushes"]))
        self.rounds_known = max(self.rounds_known, min(a["rounds"] for a in answers.values()))
        if self.spec.name == "syncopt":
            self.clock = max(self.clock, self.rounds_known)

    def install(self, server: int, answer: dict) -> None:
        """Copy one server's answer into the parameters."""
        payload = answer.pop("_payload", None)
        chunks = [self.map.chunks[cid] for cid in answer["chunks"]]
        views = unpack(payload, [(c.stop - c.start, self.params[c.param].dtype) for c in chunks])
        self.stats["bytes_pulled_per_server"][server] += 0 if payload is None else payload.nbytes
        with torch.no_grad():
            for c, view in zip(chunks, views):
                self.params[c.param].data.view(-1)[c.start:c.stop].copy_(view)
                self.versions[c.cid] = answer["versions"][c.cid]
        if payload is not None:
            self.channel.pool.give(payload)
        self.note_versions(server, answer)

    def note_versions(self, server: int, answer: dict) -> None:
        """Remember the newest versions ``server`` answered and how many of this worker's
        pushes it had applied."""
        self.newest[server] = max([self.newest[server], *answer["versions"].values()])
        self.applied_mine[server] = max(self.applied_mine[server], answer["applied_mine"])

    def stats_pushed(self) -> int:
        return sum(self.stats["bytes_pushed_per_server"])

    def stats_pulled(self) -> int:
        return sum(self.stats["bytes_pulled_per_server"])
