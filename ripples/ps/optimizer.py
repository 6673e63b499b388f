"""The worker's side of parameter-server training: ``PSOptimizer``."""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Dict, List, Optional

import torch

from ..core.errors import MismatchError, RipplesError
from ..core.optim_wrapper import OptimizerWrapper
from . import placement as placement_mod
from . import policies
from . import psld as psld_mod
from .balancer import Balancer
from .community import CommunityStep
from .epsp import TaskRunner
from .context import PSContext
from .transport import from_wire, pack, state_from_wire, state_to_wire, to_wire, unpack


class PSOptimizer(OptimizerWrapper):
    """Train through parameter servers: ``loss.backward(); opt.step()``.

    Wraps ``optimizer`` (its ``param_groups`` and ``zero_grad`` pass through); the servers
    run a copy of it (``type(optimizer)`` with each group's hyperparameters) on their
    chunks, so with ``policy="bsp"`` training is exactly synchronous SGD on gradients
    averaged over workers. The servers hold the optimizer state; the worker's ``state``
    stays empty.

    Construction is collective over the workers: worker 0 sends the initial parameters
    (and the wrapped optimizer's state, if it has any, e.g. from ``load_state_dict``
    before wrapping), every worker then pulls them. Workers whose models differ (names,
    shapes, dtypes) or whose arguments differ all raise ``MismatchError``.

    In a training script:

    - Hyperparameters: a change to any group value (``lr``, ``momentum``, ``betas``,
      ``weight_decay``; by an LR scheduler or by hand) travels with the next push and is
      used by the servers from the next update they apply. When workers disagree, a round
      (BSP, Sync-opt) uses the values of the lowest-numbered worker pushing in it (worker 0
      under BSP); an update applied on arrival uses the values of the worker that pushed it.
    - ``torch.amp.GradScaler``: ``scaler.step(opt)`` always calls ``step()``; gradients
      still scaled are unscaled here, and a worker that found inf/NaN pushes a skip marker
      instead of gradients. Under BSP and Sync-opt the whole round is then skipped (as a
      synchronous step on the averaged gradient would be); otherwise only that push is.
      Each worker's scaler adjusts its scale from its own gradients.
    - Gradient clipping before ``step()`` and several ``backward()`` calls per ``step()``
      act on this worker's gradient, before the servers average it with the others'.
    - A parameter whose ``grad`` is None (frozen, or unused on this worker) is not pushed:
      a BSP round counts it as zero in the average, and a parameter no worker has a
      gradient for is left alone by the servers' optimizer, as torch would.
    - ``state_dict()`` asks the servers (one round trip, not collective) and returns the
      wrapped optimizer's format with the servers' state per parameter in ``"state"``,
      so it also loads into a plain torch optimizer. ``load_state_dict`` is collective
      over the workers, like construction: see its docstring.

    Arguments:
        policy: one of ``policies.POLICIES`` (see ``ripples.ps.policies``).
        staleness: SSP's bound ``s >= 0``; required for ``"ssp"``, None otherwise.
        placement: a name in ``placement.PLACEMENTS`` or a callable (see ``placement.plan``).
        chunk_bytes: largest chunk; bigger tensors are split.
        eager_scale, max_lag, coupled: the eager policy's factor (``"inverse"`` 1/tau,
            ``"sqrt"``, ``"constant"``), lag bound beyond which a step blocks for fresh
            parameters, and switch back to push-then-pull.
        timeout_s: servers report workers that hold a round back after this long; a worker
            gives up on a silent server after twice this long (RipplesTimeoutError).
        backup_workers: Sync-opt's ``b``; a round applies the first ``W - b`` pushes.
        link_delay_s: emulated one-way latency added by the servers to every message
            (benchmarks only).
        controller: called as ``controller(self)`` at the end of every ``step()``, at an
            iteration boundary (the place for schemes that re-form communities, rebalance
            work or move chunks from measured ``metrics()``).
        communities, regroup_every: ``policy="casp"``: ``"auto"`` (sort-and-cut chooses the
            number of communities), ``"learned"`` (the actor-critic of
            ``ripples.ps.learned_controller`` chooses it) or a fixed count; rounds between
            regroupings. Needs
            ripples initialized in PS mode (``ripples.torch.init`` with ``ps_servers``);
            every worker must make the same number of steps. See ``ripples.ps.casp``.
        tasks_per_clock, rebalance_every: ``policy="epsp"``/``"flexrr"``: micro-batch
            tasks per clock; clocks between rebalancings (EPSP). The loop takes its
            micro-batches from ``ripples.ps.TaskSampler(self, ...)``; see ``ripples.ps.epsp``.
    """

    def __init__(self, optimizer, named_parameters, context: PSContext, policy="bsp",
                 staleness=None, placement="roundrobin", chunk_bytes=4 << 20,
                 eager_scale="inverse", max_lag=None, coupled=False, timeout_s=60,
                 backup_workers=1, link_delay_s=0.0, controller=None, communities=None,
                 regroup_every=None, tasks_per_clock=None, rebalance_every=None, psld=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)}")
        if not isinstance(context, PSContext) or context.worker < 0:
            raise TypeError("context must be the worker PSContext returned by ripples.ps.start")
        super().__init__(optimizer)
        self.context = context
        self.channel = context.channel
        self.worker = context.worker
        self.controller = controller
        # Validate locally, then agree: a worker with bad arguments must not leave the
        # others waiting in the collective check.
        problem = None
        try:
            self._validate(optimizer, named_parameters, policy, staleness, placement, chunk_bytes,
                           eager_scale, max_lag, coupled, timeout_s, backup_workers, link_delay_s,
                           communities, regroup_every, tasks_per_clock, rebalance_every, psld)
        except (TypeError, ValueError, RipplesError) as exc:
            problem = exc
        placement_name = getattr(placement, "__qualname__", placement)  # no addresses
        self._check_same_everywhere(problem, policy, staleness, backup_workers, eager_scale,
                                    max_lag, coupled, chunk_bytes, placement_name, communities,
                                    regroup_every, tasks_per_clock, rebalance_every, psld)
        self.sid = context.new_session_id()
        self.servers = list(range(context.num_servers))
        self.server_chunks = {s: self.map.chunks_of(s) for s in self.servers}
        self.versions: Dict[int, int] = {c.cid: 0 for c in self.map.chunks}
        self.newest: Dict[int, int] = {s: 0 for s in self.servers}
        self.applied_mine: Dict[int, int] = {s: 0 for s in self.servers}
        self.clock = 0
        self.pushes = 0
        self.joined = False
        self.pending_pull: Optional[Dict[int, int]] = None
        self.rounds_known = 0  # rounds (clocks) applied, as the latest answer said
        self.server_stats: Optional[List[dict]] = None
        self.stats = {"steps": 0, "bytes_pushed_per_server": [0] * len(self.servers),
                      "bytes_pulled_per_server": [0] * len(self.servers), "time_blocked_s": 0.0,
                      "expected_tau_hist": {}, "gate_log": [], "blocked_by_max_lag": 0,
                      "redirects": 0, "map_versions": []}
        if self.worker == 0:
            self._send_init(optimizer, self.groups)
        self._sent_hyper: Optional[List[dict]] = None  # every worker sends its groups once
        self.optimizer.state.clear()  # the servers hold it from now on
        self.last_plan = None
        self.last_profiles: Dict[int, Dict[int, float]] = {}
        self.announced_version = 0  # the newest map version worker 0 has announced
        self.balancer = None
        self.total_pushes = 0  # pushes of all workers, as of the last pull (a CASP round
        # counts once per member): the servers' view of global progress in worker steps
        self._install_all(self._wait_all(self.request_pull(), "initial pull", count_blocked=False))
        self.community = CommunityStep(self) if self.spec.name == "casp" else None
        self.balancer = Balancer(self, self.psld_config) if self.psld_config else None
        self.tasks = TaskRunner(self) if self.spec.name in policies.TASK_POLICIES else None

    def _validate(self, optimizer, named_parameters, policy, staleness, placement, chunk_bytes,
                  eager_scale, max_lag, coupled, timeout_s, backup_workers, link_delay_s,
                  communities, regroup_every, tasks_per_clock, rebalance_every, psld):
        context = self.context
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(link_delay_s, (int, float)) or link_delay_s < 0:
            raise ValueError(f"link_delay_s must be a number >= 0, got {link_delay_s!r}")
        self.timeout_s = float(timeout_s)
        self.link_delay_s = float(link_delay_s)
        self.spec = policies.make_spec(policy, context.num_workers, staleness, backup_workers,
                                       eager_scale, max_lag, coupled, communities, regroup_every,
                                       tasks_per_clock, rebalance_every)
        if policy == "casp":
            CommunityStep.check_runtime(context.num_workers)
        self.names, self.params, groups = _collect(optimizer, named_parameters)
        infos = [placement_mod.ParamInfo(n, p.numel(), p.element_size())
                 for n, p in zip(self.names, self.params)]
        active = context.num_servers - context.spare
        self.map = placement_mod.plan(infos, active, placement, chunk_bytes)
        if context.spare:
            self.map = dataclasses.replace(self.map, num_servers=context.num_servers,
                                           active=tuple(range(active)))
        if psld is True:
            psld = psld_mod.PSLDConfig()
        if psld is not None and not isinstance(psld, psld_mod.PSLDConfig):
            raise TypeError(f"psld must be None, True or a ripples.ps.psld.PSLDConfig, got {psld!r}")
        if psld is not None and policy != "bsp":
            raise ValueError(f"psld moves chunks at BSP round boundaries: use policy='bsp' "
                             f"with psld (got policy={policy!r})")
        self.psld_config = psld
        self.groups = groups
        if self.controller is not None and not callable(self.controller):
            raise TypeError("controller must be None or a callable controller(ps_optimizer)")

    # -- training ------------------------------------------------------------------------
    # GradScaler.step() then calls step() even when gradients are not finite, with
    # ``grad_scale`` and ``found_inf`` set: under BSP every worker must push every round.
    _step_supports_amp_scaling = True

    def step(self, closure=None):
        """Push this worker's gradients (and hyperparameters that changed) and pull
        parameters as the policy says."""
        if self.joined:
            raise RipplesError("step() after join(): this worker has left parameter-server training")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = self._unscale_for_amp()
        if self.community is not None:
            self.community.step(skip)
        elif self.tasks is not None:
            self.tasks.step(skip)
        elif self.spec.decoupled:
            self._eager_step(skip)
        else:
            if self.balancer is not None:
                self.balancer.pushing()
            self._push(1.0, skip)
            answers = self._wait_all(self.request_pull(), f"pull after step {self.clock}")
            if self.balancer is not None:
                self.balancer.pulled(answers)
            self._install_all(answers)
        self.stats["steps"] += 1
        if self.balancer is not None:
            self.balancer.boundary()
        if self.controller is not None:
            self.controller(self)
        return loss

    # -- pieces the community and task policies compose ------------------------------------
    def stats_pushed(self) -> int:
        return sum(self.stats["bytes_pushed_per_server"])

    def stats_pulled(self) -> int:
        return sum(self.stats["bytes_pulled_per_server"])

    def pull_now(self) -> None:
        """Pull after this worker's clock and install the answer (blocking)."""
        self.install_pull(self.request_pull())

    def install_pull(self, rids: Dict[int, int]) -> None:
        """Wait for the pull asked as ``rids`` and install its answer."""
        self._install_all(self._wait_all(rids, f"pull after step {self.clock}"))

    def push_and_pull(self, skip: bool, extra: dict) -> None:
        """Push the parameters' ``.grad`` with ``extra`` message fields, then pull."""
        self._push(1.0, skip, extra=extra)
        self.pull_now()

    def push_sums(self, sums: List[Optional[torch.Tensor]], extra: dict, skip: bool) -> None:
        """Push ``sums`` (one tensor or None per parameter) with ``extra`` message fields,
        without advancing the clock."""
        self._push(1.0, skip, grads=sums, extra=extra, advance=False)

    def _unscale_for_amp(self) -> bool:
        """Under ``GradScaler.step``: unscale the gradients it left scaled; True when this
        worker's gradients are not finite (the update must be skipped)."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:
            return False
        if found_inf.item():
            return True
        scale = getattr(self, "grad_scale", None)
        if scale is not None:
            inverse = scale.double().reciprocal().float()  # as GradScaler.unscale_ does
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(inverse.to(p.grad.device))
        return False

    def _eager_step(self, skip: bool):
        # Answers that arrived during the forward/backward tell the newest version; they
        # are installed only after the push, which must name the versions computed on.
        arrived = {}
        for server, rid in (self.pending_pull or {}).items():
            answer = self.channel.poll(server, rid)
            if answer is not None:
                arrived[server] = answer
                self._note_versions(server, answer)
        tau = self._expected_tau()
        lagging = self.spec.max_lag is not None and tau - 1 > self.spec.max_lag
        self._push(policies.eager_factor(tau, self.spec.eager_scale), skip)
        if self.pending_pull:
            rest = {s: rid for s, rid in self.pending_pull.items() if s not in arrived}
            arrived.update(self._wait_all(rest, "eager pull"))
            self._install_all(arrived)
        self.pending_pull = self.request_pull()
        if lagging:
            self.stats["blocked_by_max_lag"] += 1
            self._install_all(self._wait_all(self.pending_pull, "eager pull (max_lag)"))
            self.pending_pull = None

    def _expected_tau(self) -> int:
        worst = 1
        for server in self.servers:
            chunks = self.server_chunks[server]
            computed_on = min((self.versions[c.cid] for c in chunks), default=0)
            in_flight = self.pushes - self.applied_mine[server]
            worst = max(worst, policies.expected_tau(self.newest[server], computed_on, in_flight))
        hist = self.stats["expected_tau_hist"]
        hist[worst] = hist.get(worst, 0) + 1
        return worst

    def join(self):
        """Leave training: wait until every worker has joined, then hold the servers' final
        parameters. Returns the number of steps this worker made. Under ``policy="casp"``
        the worker first serves its community's rounds (with no gradient) until every
        member has finished, so workers may run different numbers of steps."""
        if self.joined:
            return self.stats["steps"]
        failure = None
        if self.community is not None:
            try:
                self.community.leave()
            except RipplesError as exc:  # still join the servers: no one else may wait
                failure = exc
        if self.pending_pull:
            self._install_all(self._wait_all(self.pending_pull, "eager pull before join",
                                             count_blocked=False))
            self.pending_pull = None
        rids = {s: self.channel.send(s, {"kind": "join", "sid": self.sid, "w": self.worker})
                for s in self.servers}
        answers = self._wait_all(rids, "join", count_blocked=False)
        self._install_all(answers)
        self.server_stats = [answers[s]["stats"] for s in self.servers]
        self.joined = True
        if failure is not None:
            raise failure
        return self.stats["steps"]

    def metrics(self) -> dict:
        """This worker's traffic and waiting, and every server's load and staleness.

        Keys: policy, steps, bytes_pushed, bytes_pulled, bytes_*_per_server, time_blocked_s
        (waiting inside ``step()``),
        expected_tau_hist (eager), gate_log ((own pushes, slowest active worker's pushes)
        when each pull was answered), staleness_hist (realized, all servers), dropped,
        server_load (per server: bytes_in, bytes_out, busy_s, updates, dropped, skipped
        (pushes or rounds not applied because a GradScaler found inf/NaN), ...),
        bytes_pushed_per_step / bytes_pulled_per_step (this worker's bytes over its steps;
        divide by the samples of a step for bytes per sample).
        CASP adds communities (the current plan), community (rounds, collective_s, plans
        adopted, bytes pushed and pulled per community by this worker as leader) and
        speed_ema_s; server_load[i]["bytes_in_per_community"] counts what each community
        pushed. EPSP/FlexRR add tasks (this worker's tasks, stolen ones, task_log,
        requests, claim_wait_s: time waiting for claim or move answers) and
        task_board (server 0: transfers, claims, rebalances, shares_log, transfer_log).
        Before ``join()`` this asks the servers (a round trip).
        """
        servers = self.server_stats
        if servers is None:
            rids = {s: self.channel.send(s, {"kind": "stats", "sid": self.sid, "w": self.worker})
                    for s in self.servers}
            answers = self._wait_all(rids, "metrics", count_blocked=False)
            servers = [answers[s]["stats"] for s in self.servers]
        hist: Dict[int, int] = {}
        for stats in servers:
            for delay, count in stats["staleness_hist"].items():
                hist[delay] = hist.get(delay, 0) + count
        out = dict(self.stats, policy=self.spec.name, staleness_hist=dict(sorted(hist.items())),
                   server_load=servers, dropped=sum(s["dropped"] for s in servers))
        out["bytes_pushed"] = sum(self.stats["bytes_pushed_per_server"])
        out["bytes_pulled"] = sum(self.stats["bytes_pulled_per_server"])
        out["bytes_pushed_per_step"] = out["bytes_pushed"] / max(1, self.stats["steps"])
        out["bytes_pulled_per_step"] = out["bytes_pulled"] / max(1, self.stats["steps"])
        if self.community is not None:
            out["communities"] = [list(c) for c in self.community.plan]
            out["community"] = dict(self.community.stats, plans=[
                (v, [list(c) for c in plan]) for v, plan in self.community.stats["plans"]])
            out["speed_ema_s"] = servers[0].get("speed_ema_s", {})
        if self.balancer is not None:
            out["psld"] = self.balancer.summary()
        if self.tasks is not None:
            out["tasks"] = dict(self.tasks.stats)
            out["task_board"] = servers[0].get("tasks", {})
        return out

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self):
        """The wrapped optimizer's ``state_dict()`` with the servers' optimizer state.

        ``"state"`` holds, per parameter index, the state the servers keep for its chunks
        reassembled to the parameter's shape (momentum buffers, Adam moments; values such
        as step counts from its first chunk). Under asynchronous policies it is the state
        when each server answers. ``"param_groups"`` are this worker's hyperparameters;
        ``"ripples"`` holds this session's clock and versions (see ``extra_state``).
        Not collective: any worker may call it, e.g. worker 0 to save a checkpoint.
        """
        rids = {s: self.channel.send(s, {"kind": "state", "sid": self.sid, "w": self.worker})
                for s in self.servers}
        answers = self._wait_all(rids, "state_dict", count_blocked=False)
        chunk_state = {cid: wire for answer in answers.values()
                       for cid, wire in answer["state"].items()}
        moving = [c.cid for c in self.map.chunks if c.cid not in chunk_state]
        if moving:
            raise RipplesError(f"state_dict on worker {self.worker}: chunks {moving} are moving "
                               f"between servers; call it on worker 0 after step(), where no "
                               f"chunk is in transit")
        state = super().state_dict()
        index_of = {id(p): i for i, p in enumerate(
            p for group in self.optimizer.param_groups for p in group["params"])}
        state["state"] = {}
        for param_index, param in enumerate(self.params):
            chunks = sorted((c for c in self.map.chunks if c.param == param_index),
                            key=lambda c: c.start)
            assembled = _assemble(param, [chunk_state[c.cid] for c in chunks])
            if assembled:
                state["state"][index_of[id(param)]] = assembled
        state["state"] = dict(sorted(state["state"].items()))
        return state

    def extra_state(self) -> dict:
        """The session's counters, for the record: ``policy``, ``clock`` (this worker's
        pushes), ``steps`` and ``versions`` (per parameter name, the updates applied to each
        of its chunks when this worker last pulled). A resumed run needs none of them: BSP
        rounds and staleness are counted within a session, step counts live in the state.
        ``chunk_map`` (the chunks, their owners and the active servers, e.g. as PSLD left
        them) is restored by ``load_state_dict``."""
        versions = {name: [self.versions[c.cid] for c in self.map.chunks if c.param == i]
                    for i, name in enumerate(self.names)}
        chunk_map = {"version": self.map.version, "owners": list(self.map.owners),
                     "active": list(self.map.members),
                     "chunks": [(c.param, c.start, c.stop) for c in self.map.chunks]}
        return {"policy": self.spec.name, "clock": self.clock, "steps": self.stats["steps"],
                "versions": versions, "chunk_map": chunk_map}

    def load_extra_state(self, extra: dict) -> None:
        self._saved_map = extra.get("chunk_map")

    def _restore_map(self) -> None:
        """Worker 0 moves the chunks back where the checkpoint had them (live, as PSLD
        would), when the checkpoint's chunks are this session's and the policy is BSP."""
        saved, self._saved_map = getattr(self, "_saved_map", None), None
        if (self.worker != 0 or saved is None or self.spec.name != "bsp"
                or tuple(saved["owners"]) == self.map.owners
                or [tuple(c) for c in saved["chunks"]] != [(c.param, c.start, c.stop)
                                                            for c in self.map.chunks]
                or max(saved["owners"] + saved["active"]) >= self.map.num_servers):
            return
        self.move_chunks(saved["owners"], saved["active"])

    def load_state_dict(self, state_dict):
        """Load a checkpoint: collective over the workers, like construction.

        Every worker loads ``state_dict`` into the wrapped optimizer (hyperparameters and
        state, as torch does); worker 0 then sends the state, its hyperparameters and its
        current parameters to the servers, and every worker pulls the result. Load the
        model's weights on worker 0 before calling it (the servers take worker 0's
        parameters, as at construction). Accepts a plain torch optimizer's state dict too.
        Under BSP the checkpoint's chunk map comes back as well (worker 0 announces it; the
        chunks move live during the next steps) when it cuts the parameters the same way.
        """
        if self.pending_pull:
            self._install_all(self._wait_all(self.pending_pull, "eager pull before load",
                                             count_blocked=False))
            self.pending_pull = None
        # A worker that cannot load must not leave the others waiting for worker 0.
        problem = None
        try:
            super().load_state_dict(state_dict)
        except (KeyError, TypeError, ValueError) as exc:
            problem = exc
        everyone = self.context.worker_comm.allgather(repr(problem) if problem else None)
        if problem is not None:
            raise problem
        for worker, theirs in enumerate(everyone):
            if theirs:
                raise RipplesError(f"load_state_dict failed on worker {worker}: {theirs}")
        if self.worker == 0:
            try:
                rids = {s: self.channel.send(s, self._load_message(s)) for s in self.servers}
                self._wait_all(rids, "load_state_dict", count_blocked=False)
            except RipplesError as exc:
                problem = str(exc)
        problem = self.context.worker_comm.bcast(problem, root=0)
        if problem is not None:
            raise RipplesError(f"load_state_dict failed on the servers: {problem}")
        self.optimizer.state.clear()
        self._sent_hyper = None
        self._install_all(self._wait_all(self.request_pull(), "pull after load_state_dict",
                                         count_blocked=False))
        self._restore_map()

    def _load_message(self, server: int) -> dict:
        params, state = {}, {}
        for c in self.server_chunks[server]:
            p = self.params[c.param]
            params[c.cid] = to_wire(p.data.view(-1)[c.start:c.stop]).copy()
            state[c.cid] = state_to_wire(self.optimizer.state.get(p, {}), p.shape, c.start, c.stop)
        return {"kind": "load", "sid": self.sid, "w": self.worker, "params": params,
                "state": state, "groups": _hyperparameters(self.optimizer.param_groups),
                "map": self.map.version}

    # -- messages ------------------------------------------------------------------------
    def _changed_hyperparameters(self) -> Optional[List[dict]]:
        """Every group's values when any changed since the last push, else None."""
        groups = self.optimizer.param_groups
        if self._sent_hyper is not None and len(groups) == len(self._sent_hyper) and all(
                _same_hyperparameters(g, sent) for g, sent in zip(groups, self._sent_hyper)):
            return None
        self._sent_hyper = _hyperparameters(groups)
        return self._sent_hyper

    def _push(self, factor: float, skip: bool = False, grads=None, extra=None,
              advance=True) -> None:
        hyper = self._changed_hyperparameters()
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

    def members(self) -> List[int]:
        """The servers this worker pushes to and pulls from under its current map."""
        return list(self.map.members)

    def request_pull(self, after: Optional[int] = None) -> Dict[int, int]:
        """Ask every server for its parameters once the gate lets clock ``after`` (default:
        this worker's clock) start."""
        after = self.clock if after is None else after
        return {s: self.channel.send(s, {"kind": "pull", "sid": self.sid, "w": self.worker,
                                         "after": after, "map": self.map.version})
                for s in self.members()}

    def _wait_all(self, rids: Dict[int, int], what: str, count_blocked=True) -> Dict[int, dict]:
        began = time.monotonic()
        answers = {s: self.channel.wait(s, rid, 2 * self.timeout_s, f"worker {self.worker} {what}")
                   for s, rid in rids.items()}
        if count_blocked:
            self.stats["time_blocked_s"] += time.monotonic() - began
        return answers

    def _install_all(self, answers: Dict[int, dict]) -> None:
        installed = set()
        for server, answer in answers.items():
            self._install(server, answer)
            installed.update(answer["chunks"])
            if "profiles" in answer:
                self.last_profiles = answer["profiles"]
        newest = max(answers.values(), key=lambda a: a.get("map", 0))
        if newest.get("map", 0) > self.map.version:
            self._adopt_map(newest)
            self._redirect(installed, answers)
        first = answers[min(answers)]
        if "plan" in first:
            self.last_plan = first["plan"]
        self.total_pushes = max(self.total_pushes, first.get("total_pushes", 0))
        if "min_pushes" in first:
            self.stats["gate_log"].append((first["pushes"], first["min_pushes"]))
        self.rounds_known = max(self.rounds_known, min(a["rounds"] for a in answers.values()))
        if self.spec.name == "syncopt":
            self.clock = max(self.clock, self.rounds_known)

    def move_chunks(self, owners, active=None) -> int:
        """Announce a new chunk map (worker 0, between steps, ``policy="bsp"``): chunk ``i``
        moves to server ``owners[i]`` from the round after the next one on; ``active``
        (default: the servers that own chunks) are the servers workers talk to, so a server
        left without chunks returns to spare and a spare given chunks becomes active.

        The move happens live (see ``ripples.ps.migration``); every worker picks up the
        map from its next pull answers. Returns the new map version. Raises ValueError
        for an owner that is not a server, or when called off worker 0, under another policy
        or before the previous announced map is in use.
        """
        owners = tuple(int(o) for o in owners)
        problem = None
        if self.worker != 0:
            problem = f"only worker 0 moves chunks (this is worker {self.worker})"
        elif self.spec.name != "bsp":
            problem = f"chunks move at BSP round boundaries; this session runs {self.spec.name!r}"
        elif len(owners) != len(self.map.chunks):
            problem = f"owners has {len(owners)} entries for {len(self.map.chunks)} chunks"
        elif not all(0 <= o < self.map.num_servers for o in owners):
            problem = f"owners must be servers 0..{self.map.num_servers - 1}, got {owners}"
        elif self.announced_version != self.map.version:
            problem = (f"map version {self.announced_version} is announced but not in use yet: "
                       f"step() once more before moving chunks again")
        if problem:
            raise ValueError(f"move_chunks: {problem}")
        active = tuple(sorted(set(owners) if active is None else set(active)))
        if not set(owners) <= set(active):
            raise ValueError(f"move_chunks: active {active} must include every owner")
        self.announced_version = self.map.version + 1
        order = {"kind": "remap", "sid": self.sid, "w": self.worker, "version": self.announced_version,
                 "owners": owners, "active": active, "effective": self.clock + 1}
        for server in self.servers:
            self.channel.send(server, dict(order))
        return self.announced_version

    def _adopt_map(self, answer: dict) -> None:
        """Work under the newer chunk map a server answered with (see ``migration``)."""
        self.map = dataclasses.replace(self.map, version=answer["map"],
                                       owners=tuple(answer["owners"]),
                                       active=tuple(answer["active"]))
        self.server_chunks = {s: self.map.chunks_of(s) for s in self.servers}
        self.stats["map_versions"].append((self.clock, self.map.version))
        if self.balancer is not None:
            self.balancer.map_changed()

    def _redirect(self, installed: set, answers: Dict[int, dict]) -> None:
        """Pull the chunks an old owner no longer had from their new owners."""
        missing = [c for c in self.map.chunks if c.cid not in installed]
        if not missing:
            return
        owners = sorted({self.map.owners[c.cid] for c in missing})
        self.stats["redirects"] += len(owners)
        rids = {s: self.channel.send(s, {"kind": "pull", "sid": self.sid, "w": self.worker,
                                         "after": self.clock, "map": self.map.version})
                for s in owners}
        more = self._wait_all(rids, f"pull redirected to servers {owners}")
        for server, answer in more.items():
            self._install(server, answer)
            installed.update(answer["chunks"])
        still = [c.cid for c in self.map.chunks if c.cid not in installed]
        if still:
            raise RipplesError(f"worker {self.worker}: chunks {still} were not on their owners "
                               f"under map version {self.map.version} after a redirect")
        answers.update(more)

    def _install(self, server: int, answer: dict) -> None:
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
        self._note_versions(server, answer)

    def _note_versions(self, server: int, answer: dict) -> None:
        self.newest[server] = max([self.newest[server], *answer["versions"].values()])
        self.applied_mine[server] = max(self.applied_mine[server], answer["applied_mine"])

    def _send_init(self, optimizer, groups: List[int]) -> None:
        hyper = _hyperparameters(optimizer.param_groups)
        for server in self.servers:
            chunks = [(c.cid, groups[c.param], to_wire(self.params[c.param].data.view(-1)
                                                       [c.start:c.stop]).copy())
                      for c in self.server_chunks[server]]
            state = {c.cid: state_to_wire(optimizer.state.get(self.params[c.param], {}),
                                          self.params[c.param].shape, c.start, c.stop)
                     for c in self.server_chunks[server]}
            self.channel.send(server, {
                "kind": "init", "sid": self.sid, "w": self.worker, "chunks": chunks, "state": state,
                "opt_class": type(optimizer), "defaults": dict(optimizer.defaults),
                "groups": hyper, "spec": self.spec, "link_delay_s": self.link_delay_s,
                "map_version": self.map.version, "owners": self.map.owners,
                "active": self.map.members, "timeout_s": self.timeout_s})

    def _check_same_everywhere(self, problem, *arguments) -> None:
        params = [] if problem else list(zip(self.names, self.params))
        mine = {"params": [(n, tuple(p.shape), str(p.dtype)) for n, p in params],
                "arguments": repr(arguments), "problem": repr(problem) if problem else None}
        everyone = self.context.worker_comm.allgather(mine)
        if problem is not None:
            raise problem
        for worker, theirs in enumerate(everyone):
            if theirs["problem"]:
                raise MismatchError(f"worker {worker} rejected its PSOptimizer arguments: "
                                    f"{theirs['problem']}")
        reference = everyone[0]
        for worker, theirs in enumerate(everyone):
            if theirs == reference:
                continue
            if theirs["arguments"] != reference["arguments"]:
                raise MismatchError(f"PSOptimizer arguments differ: worker 0 {reference['arguments']}"
                                    f", worker {worker} {theirs['arguments']}")
            raise MismatchError(f"models differ between workers: {_first_difference(reference['params'], theirs['params'], worker)}")


def _collect(optimizer, named_parameters):
    """Names, tensors and optimizer group index of every parameter, in a fixed order."""
    group_of = {}
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            group_of[id(p)] = index
    names, params, groups, seen = [], [], [], set()
    for item in named_parameters:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError("named_parameters must yield (name, tensor) pairs, as "
                            "model.named_parameters() does")
        name, p = item
        if id(p) in seen:
            continue
        if id(p) not in group_of:
            raise ValueError(f"named_parameters: {name!r} is not among the optimizer's parameters")
        seen.add(id(p))
        names.append(name)
        params.append(p)
        groups.append(group_of[id(p)])
    if len(seen) != len(group_of):
        raise ValueError(f"named_parameters names {len(seen)} tensors but the optimizer holds "
                         f"{len(group_of)}; pass model.named_parameters() of the optimized model")
    return names, params, groups


def _hyperparameters(groups) -> List[dict]:
    """A copy of every group's values except its parameters."""
    return [copy.deepcopy({k: v for k, v in g.items() if k != "params"}) for g in groups]


def _same_hyperparameters(group: dict, sent: dict) -> bool:
    return len(group) == len(sent) + 1 and all(
        k in group and _same_value(group[k], v) for k, v in sent.items())


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def _assemble(param: torch.Tensor, chunk_wires: List[dict]) -> dict:
    """One parameter's optimizer state from its chunks' ``state_to_wire`` messages (in
    element order): slices are joined to the parameter's shape, whole values come from the
    first chunk. Keys missing from any chunk are left out."""
    out = {}
    for key, (kind, value) in (chunk_wires[0].items() if chunk_wires else ()):
        if not all(key in wire for wire in chunk_wires):
            continue
        if kind == "slice":
            joined = torch.cat([from_wire(wire[key][1]) for wire in chunk_wires])
            out[key] = joined.reshape(param.shape)
        else:
            out[key] = state_from_wire({key: (kind, value)})[key]
    return out


def _first_difference(reference, theirs, worker) -> str:
    for a, b in zip(reference, theirs):
        if a != b:
            return (f"worker 0 has {a[0]!r} shape {a[1]} {a[2]}, worker {worker} has "
                    f"{b[0]!r} shape {b[1]} {b[2]}")
    return (f"worker 0 has {len(reference)} parameter tensors, worker {worker} has "
            f"{len(theirs)}")
