"""What one ``PSOptimizer.step()`` does under the plain and the eager policies.

``PlainStep`` (BSP, ASP, SSP, DynSGD, ConSGD, Sync-opt): push, then wait for the pull the
policy's gate answers. ``EagerStep`` (``policy="eager"``): push with the factor of the
expected staleness, then ask for the next parameters without waiting; they are installed
at the next step, after its push. Communities (``community.CommunityStep``) and tasks
(``epsp.TaskRunner``) have the same ``step(skip)``. ``link`` is the worker's
``worker_link.ServerLink``.
"""
from __future__ import annotations

import torch

from . import policies


def unscale_for_amp(optimizer, params) -> bool:
    """Under ``GradScaler.step``: unscale the gradients it left scaled on ``optimizer``'s
    ``params``; True when this worker's gradients are not finite (the update must be
    skipped)."""
    found_inf = getattr(optimizer, "found_inf", None)
    if found_inf is None:
        return False
    if found_inf.item():
        return True
    scale = getattr(optimizer, "grad_scale", None)
    if scale is not None:
        inverse = scale.double().reciprocal().float()  # as GradScaler.unscale_ does
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(inverse.to(p.grad.device))
    return False


class PlainStep:
    """Push then pull; ``balancer`` (PSLD's ``balancer.Balancer``, or None) times both."""

    def __init__(self, link, balancer=None):
        self.link = link
        self.balancer = balancer

    def step(self, skip: bool) -> None:
        link = self.link
        if self.balancer is not None:
            self.balancer.pushing()
        link.push(1.0, skip)
        answers = link.wait_all(link.request_pull(), f"pull after step {link.clock}")
        if self.balancer is not None:
            self.balancer.pulled(answers)
        link.install_all(answers)


class EagerStep:
    """Push, then ask for the next parameters and install them one step later (blocking
    only when the expected staleness exceeds ``max_lag``)."""

    def __init__(self, link):
        self.link = link

    def step(self, skip: bool) -> None:
        link = self.link
        # Answers that arrived during the forward/backward tell the newest version; they
        # are installed only after the push, which must name the versions computed on.
        arrived = {}
        for server, rid in (link.pending_pull or {}).items():
            answer = link.channel.poll(server, rid)
            if answer is not None:
                arrived[server] = answer
                link.note_versions(server, answer)
        tau = self.expected_tau()
        lagging = link.spec.max_lag is not None and tau - 1 > link.spec.max_lag
        link.push(policies.eager_factor(tau, link.spec.eager_scale), skip)
        if link.pending_pull:
            rest = {s: rid for s, rid in link.pending_pull.items() if s not in arrived}
            arrived.update(link.wait_all(rest, "eager pull"))
            link.install_all(arrived)
        link.pending_pull = link.request_pull()
        if lagging:
            link.stats["blocked_by_max_lag"] += 1
            link.install_all(link.wait_all(link.pending_pull, "eager pull (max_lag)"))
            link.pending_pull = None

    def expected_tau(self) -> int:
        """The staleness the push about to be sent will have, at worst over the servers
        (``policies.expected_tau``); counted in ``expected_tau_hist``."""
        link = self.link
        worst = 1
        for server in link.servers:
            chunks = link.server_chunks[server]
            computed_on = min((link.versions[c.cid] for c in chunks), default=0)
            in_flight = link.pushes - link.applied_mine[server]
            worst = max(worst, policies.expected_tau(link.newest[server], computed_on, in_flight))
        hist = link.stats["expected_tau_hist"]
        hist[worst] = hist.get(worst, 0) + 1
        return worst
