"""The workers' side of live chunk migration (the servers' side is ``migration``).

Worker 0 announces a new chunk map (``ChunkMover.move``); every worker adopts it from the
first pull answer that carries it (``adopt_map``) and pulls the chunks that its old owners
no longer had from their new owners (``redirect``). ``link`` is the worker's
``worker_link.ServerLink``.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from ..core.errors import RipplesError


class ChunkMover:
    """Worker 0's announcements of new chunk maps for one session."""

    def __init__(self, link):
        self.link = link
        self.announced_version = 0  # the newest map version worker 0 has announced

    def move(self, owners, active=None) -> int:
        """See ``PSOptimizer.move_chunks``."""
        link = self.link
        owners = tuple(int(o) for o in owners)
        problem = None
        if link.worker != 0:
            problem = f"only worker 0 moves chunks (this is worker {link.worker})"
        elif link.spec.name != "bsp":
            problem = f"chunks move at BSP round boundaries; this session runs {link.spec.name!r}"
        elif len(owners) != len(link.map.chunks):
            problem = f"owners has {len(owners)} entries for {len(link.map.chunks)} chunks"
        elif not all(0 <= o < link.map.num_servers for o in owners):
            problem = f"owners must be servers 0..{link.map.num_servers - 1}, got {owners}"
        elif self.announced_version != link.map.version:
            problem = (f"map version {self.announced_version} is announced but not in use yet: "
                       f"step() once more before moving chunks again")
        if problem:
            raise ValueError(f"move_chunks: {problem}")
        active = tuple(sorted(set(owners) if active is None else set(active)))
        if not set(owners) <= set(active):
            raise ValueError(f"move_chunks: active {active} must include every owner")
        self.announced_version = link.map.version + 1
        order = {"kind": "remap", "sid": link.sid, "w": link.worker,
                 "version": self.announced_version, "owners": owners, "active": active,
                 "effective": link.clock + 1}
        for server in link.servers:
            link.channel.send(server, dict(order))
        return self.announced_version

    def restore(self, saved: Optional[dict]) -> None:
        """Worker 0 moves the chunks back where a checkpoint's ``chunk_map`` had them (live,
        as PSLD would), when the checkpoint's chunks are this session's and the policy is
        BSP."""
        chunk_map = self.link.map
        if (self.link.worker != 0 or saved is None or self.link.spec.name != "bsp"
                or tuple(saved["owners"]) == chunk_map.owners
                or [tuple(c) for c in saved["chunks"]] != [(c.param, c.start, c.stop)
                                                            for c in chunk_map.chunks]
                or max(saved["owners"] + saved["active"]) >= chunk_map.num_servers):
            return
        self.move(saved["owners"], saved["active"])


def adopt_map(link, answer: dict) -> None:
    """Work under the newer chunk map a server answered with (see ``migration``)."""
    link.map = dataclasses.replace(link.map, version=answer["map"],
                                   owners=tuple(answer["owners"]),
                                   active=tuple(answer["active"]))
    link.server_chunks = {s: link.map.chunks_of(s) for s in link.servers}
    link.stats["map_versions"].append((link.clock, link.map.version))
    if link.balancer is not None:
        link.balancer.map_changed()


def redirect(link, installed: set, answers: Dict[int, dict]) -> None:
    """Pull the chunks an old owner no longer had from their new owners; ``installed``: the
    chunks installed from ``answers``, both completed here."""
    missing = [c for c in link.map.chunks if c.cid not in installed]
    if not missing:
        return
    owners = sorted({link.map.owners[c.cid] for c in missing})
    link.stats["redirects"] += len(owners)
    more = link.wait_all(link.request_pull(servers=owners),
                         f"pull redirected to servers {owners}")
    for server, answer in more.items():
        link.install(server, answer)
        installed.update(answer["chunks"])
    still = [c.cid for c in link.map.chunks if c.cid not in installed]
    if still:
        raise RipplesError(f"worker {link.worker}: chunks {still} were not on their owners "
                           f"under map version {link.map.version} after a redirect")
    answers.update(more)
