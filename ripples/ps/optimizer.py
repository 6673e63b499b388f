"""The worker's side of parameter-server training: ``PSOptimizer``.

A thin ``torch.optim.Optimizer`` wrapper that composes its collaborators: the arguments are
checked by ``worker_setup``, the servers are reached through ``worker_link.ServerLink``, one
step is the policy's (``steps.PlainStep``/``EagerStep``, ``community.CommunityStep``,
``epsp.TaskRunner``), checkpoints are ``checkpoint.Checkpoints``, chunk moves are
``chunk_moves.ChunkMover`` (and PSLD's ``balancer.Balancer``), metrics are
``worker_metrics.summarize``.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from ..core.errors import RipplesError
from ..core.optim_wrapper import OptimizerWrapper
from . import policies, worker_metrics, worker_setup
from .balancer import Balancer
from .checkpoint import Checkpoints
from .chunk_moves import ChunkMover
from .community import CommunityStep
from .context import PSContext
from .epsp import TaskRunner
from .steps import EagerStep, PlainStep, unscale_for_amp
from .worker_link import ServerLink


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
        staleness: the bound ``s >= 0`` of ``policies.STALENESS_POLICIES``: required for
            ``"ssp"``; ``"casp"``: None is unbounded; ``"epsp"``/``"flexrr"``: None is 0
            (lockstep clocks; with ``s > 0`` most clocks are applied one clock late, which
            momentum tolerates only at a much lower learning rate: see the parameter-server
            guide, "EPSP: enforced or slack"). None for the other policies.
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
        communities, regroup_every: ``policy="casp"``: ``"auto"`` (the number of communities
            chosen from measured batches per second and from the losses passed to
            ``report_loss``, starting as ASP; a community's push weighs as its size, so
            ``lr`` is BSP's; see ``ripples.ps.casp_progress``), ``"projected"`` (the count
            that maximizes the analytic projection of ``ripples.ps.casp_scoring``),
            ``"learned"`` (the actor-critic of ``ripples.ps.learned_controller`` chooses it)
            or a fixed count (those three push their members' mean); rounds between
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
        problem, setup = None, None
        try:
            setup = worker_setup.configure(
                optimizer, named_parameters, context, policy, staleness, placement, chunk_bytes,
                eager_scale, max_lag, coupled, timeout_s, backup_workers, link_delay_s,
                communities, regroup_every, tasks_per_clock, rebalance_every, psld, controller)
        except (TypeError, ValueError, RipplesError) as exc:
            problem = exc
        placement_name = getattr(placement, "__qualname__", placement)  # no addresses
        worker_setup.agree(context.worker_comm, problem, setup, (
            policy, staleness, backup_workers, eager_scale, max_lag, coupled, chunk_bytes,
            placement_name, communities, regroup_every, tasks_per_clock, rebalance_every, psld))
        self.spec = setup.spec
        self.names, self.params = setup.names, setup.params
        self.timeout_s = setup.timeout_s
        self.sid = context.new_session_id()
        self.link = ServerLink(context, self.sid, optimizer, setup)
        self.servers = self.link.servers
        self.stats = self.link.stats
        self.joined = False
        self.server_stats: Optional[List[dict]] = None
        if self.worker == 0:
            self.link.send_init(optimizer, setup.groups, setup.link_delay_s)
        self.optimizer.state.clear()  # the servers hold it from now on
        self.mover = ChunkMover(self.link)
        self.checkpoints = Checkpoints(self.link, self.mover, optimizer, self.names,
                                       context.worker_comm)
        self.link.install_all(self.link.wait_all(self.link.request_pull(), "initial pull",
                                                 count_blocked=False))
        self.community = CommunityStep(self.link) if self.spec.name == "casp" else None
        self.balancer = Balancer(self.link, self.mover, setup.psld) if setup.psld else None
        self.link.balancer = self.balancer
        self.tasks = TaskRunner(self.link) if self.spec.name in policies.TASK_POLICIES else None
        if self.community is not None or self.tasks is not None:
            self.policy_step = self.community or self.tasks
        elif self.spec.decoupled:
            self.policy_step = EagerStep(self.link)
        else:
            self.policy_step = PlainStep(self.link, self.balancer)

    # What the collaborators keep up to date, as attributes of the optimizer.
    @property
    def map(self):
        """The chunk map in use (``placement.ChunkMap``)."""
        return self.link.map

    @property
    def clock(self) -> int:
        """This worker's pushes (rounds, for community and task policies)."""
        return self.link.clock

    @property
    def versions(self) -> Dict[int, int]:
        """Per chunk, the updates applied to the parameters this worker holds."""
        return self.link.versions

    @property
    def total_pushes(self) -> int:
        """Pushes of all workers as of the last pull (a CASP round counts once per member)."""
        return self.link.total_pushes

    # -- training ------------------------------------------------------------------------
    # GradScaler.step() then calls step() even when gradients are not finite, with
    # ``grad_scale`` and ``found_inf`` set: under BSP every worker must push every round.
    _step_supports_amp_scaling = True

    def step(self, closure=None):
        """Push this worker's gradients (and hyperparameters that changed) and pull
        parameters as the policy says."""
        if self.joined:
            raise RipplesError("step() after join(): this worker has left parameter-server "
                               "training")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if loss is not None:
                self.report_loss(loss)
        self.policy_step.step(unscale_for_amp(self, self.params))
        self.stats["steps"] += 1
        # The servers step, not the wrapped optimizer: tell an LR scheduler made on it
        # before wrapping (Horovod's usual order) that a step was taken, the mark torch's
        # schedulers check, or its first scheduler.step() warns of a wrong call order.
        self.optimizer._opt_called = True
        if self.balancer is not None:
            self.balancer.boundary()
        if self.controller is not None:
            self.controller(self)
        return loss

    def report_loss(self, loss) -> None:
        """Tell the servers this step's training loss (a float or a one-element tensor),
        before ``step()``; ``step(closure)`` does it with the closure's loss. Under
        ``policy="casp", communities="auto"`` the controller judges community counts by
        how fast these losses fall (without them, by batches per second alone); other
        policies ignore it."""
        if self.community is not None:
            self.community.loss = float(loss)

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
        self.link.settle("eager pull before join")
        answers = self.link.ask_all("join", "join")
        self.link.install_all(answers)
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
            answers = self.link.ask_all("stats", "metrics")
            servers = [answers[s]["stats"] for s in self.servers]
        return worker_metrics.summarize(self.link, servers, self.community, self.tasks,
                                        self.balancer)

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
        return self.mover.move(owners, active)

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
        return self.checkpoints.state_dict(super().state_dict)

    def extra_state(self) -> dict:
        """The session's counters, for the record: ``policy``, ``clock`` (this worker's
        pushes), ``steps`` and ``versions`` (per parameter name, the updates applied to each
        of its chunks when this worker last pulled). A resumed run needs none of them: BSP
        rounds and staleness are counted within a session, step counts live in the state.
        ``chunk_map`` (the chunks, their owners and the active servers, e.g. as PSLD left
        them) is restored by ``load_state_dict``."""
        return self.checkpoints.extra_state()

    def load_extra_state(self, extra: dict) -> None:
        self.checkpoints.saved_map = extra.get("chunk_map")

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
        self.checkpoints.load(state_dict, super().load_state_dict)
