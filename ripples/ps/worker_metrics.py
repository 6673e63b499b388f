"""``PSOptimizer.metrics()``: a worker's counters joined with every server's statistics."""
from __future__ import annotations

from typing import Dict, List


def summarize(link, servers: List[dict], community=None, tasks=None, balancer=None) -> dict:
    """The metrics (keys: see ``PSOptimizer.metrics``) of the worker behind ``link`` (its
    ``worker_link.ServerLink``), from ``servers``' snapshots and the policy's collaborators
    (``community.CommunityStep``, ``epsp.TaskRunner``, ``balancer.Balancer``; None when the
    policy has none)."""
    stats = link.stats
    hist: Dict[int, int] = {}
    for server in servers:
        for delay, count in server["staleness_hist"].items():
            hist[delay] = hist.get(delay, 0) + count
    out = dict(stats, policy=link.spec.name, staleness_hist=dict(sorted(hist.items())),
               server_load=servers, dropped=sum(s["dropped"] for s in servers))
    out["bytes_pushed"] = link.stats_pushed()
    out["bytes_pulled"] = link.stats_pulled()
    out["bytes_pushed_per_step"] = out["bytes_pushed"] / max(1, stats["steps"])
    out["bytes_pulled_per_step"] = out["bytes_pulled"] / max(1, stats["steps"])
    if community is not None:
        out["communities"] = [list(c) for c in community.plan]
        out["community"] = dict(community.stats, plans=[
            (v, [list(c) for c in plan]) for v, plan in community.stats["plans"]])
        out["speed_ema_s"] = servers[0].get("speed_ema_s", {})
    if balancer is not None:
        out["psld"] = balancer.summary()
    if tasks is not None:
        out["tasks"] = dict(tasks.stats)
        out["task_board"] = servers[0].get("tasks", {})
    return out
