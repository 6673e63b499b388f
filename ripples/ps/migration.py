"""Live migration of chunks between servers, at an iteration boundary (BSP rounds).

A new map is announced by worker 0 with a ``remap`` message to every server: version
``v + 1``, the new owners and active servers, and ``effective`` = the first round computed
under it. Worker 0 sends it at the end of its step ``c`` (its next push is round ``c``);
other workers may already have pushed round ``c`` under map ``v``, so ``effective = c + 1``.
Every server keeps applying rounds under map ``v`` and switches once it has applied round
``effective - 1`` (an idle spare, which applies no rounds, jumps to ``effective`` at once):

- chunks it no longer owns are handed over (``adopt``: parameters as a payload, optimizer
  state, update count, parameter group) to their new owner and dropped here, so a chunk
  has exactly one owner at every moment: the old one until it sends, then the message,
  then the new one;
- chunks it gains are awaited: until all have arrived it applies no round and answers no
  pull, and a push naming one waits, so nothing is computed on a chunk in transit;
- messages built against map ``v + 1`` that arrived early (hand-overs included: they carry
  the new version) are kept until the switch and replayed then, hand-overs first.

Pull answers carry the server's map. A worker that pulled under map ``v`` from an old
owner gets back the chunks that server owns now, adopts the newer map, and pulls the
missing chunks from their new owners (the redirect). Pushes of round ``c`` and earlier
are all built under ``v`` and applied by the old owners; pushes of later rounds are built
under ``v + 1``: no push is lost or applied twice, which the per-chunk update counts (they
travel with the chunk) show. A push under an older map that names a chunk the server no
longer owns cannot happen under BSP and fails the session with an error naming it.
"""
from __future__ import annotations

from .transport import PROTOCOL, REQUEST, pack, state_to_wire, unpack


def on_remap(session, message: dict) -> None:
    """Record a new map announced for round ``message["effective"]``."""
    order = {key: message[key] for key in ("version", "owners", "active", "effective")}
    if order["version"] != session.map_version + 1 + len(session.pending_maps):
        raise ValueError(f"map version {order['version']} announced while server "
                         f"{session.server.index} holds version {session.map_version}")
    if len(order["owners"]) != len(session.owners):
        raise ValueError(f"map version {order['version']} has {len(order['owners'])} owners, "
                         f"the session has {len(session.owners)} chunks")
    session.pending_maps.append(order)
    if session.server.index not in session.active_servers:  # a spare applies no rounds
        session.rounds.applied = max(session.rounds.applied, order["effective"])
    switch_due(session)


def switch_due(session) -> None:
    """Switch to every announced map whose first round is the next one to apply."""
    while session.pending_maps and session.pending_maps[0]["effective"] <= session.rounds.applied:
        switch(session, session.pending_maps.pop(0))


def switch(session, order: dict) -> None:
    me = session.server.index
    owners = tuple(order["owners"])
    for cid in sorted(session.store.chunks):
        if owners[cid] != me:
            hand_over(session, cid, owners[cid], order["version"])
    session.incoming = {cid for cid, owner in enumerate(owners)
                        if owner == me and cid not in session.store.chunks}
    session.map_version, session.owners = order["version"], owners
    session.active_servers = tuple(order["active"])
    if me not in session.active_servers:
        session.rounds.applied = max(session.rounds.applied, order["effective"])
    session.store.rebuild_optimizer()
    replay(session)


def replay(session) -> None:
    """Handle the kept messages again, hand-overs first, until none of them can proceed
    (those that still cannot are kept again by ``Session.dispatch``)."""
    while session.future:
        queued, session.future = session.future, []
        queued.sort(key=lambda message: message["kind"] != "adopt")
        for message in queued:
            session.handle(message)
        if len(session.future) >= len(queued):
            return


def waits(session, message: dict) -> bool:
    """True when ``message`` must be kept: built against a newer map, or a push naming a
    chunk still in transit to this server."""
    if message.get("map", session.map_version) > session.map_version:
        return True
    return message["kind"] == "push" and not session.incoming.isdisjoint(message["chunks"])


def hand_over(session, cid: int, dest: int, version: int) -> None:
    """Send chunk ``cid`` with its optimizer state and update count to server ``dest``."""
    store = session.store
    tensor = store.chunks.pop(cid)
    state = store.optimizer.state.pop(tensor, {}) if store.optimizer is not None else {}
    header = {"kind": "adopt", "v": PROTOCOL, "sid": session.sid, "server": session.server.index,
              "map": version, "cid": cid, "numel": tensor.numel(), "dtype": tensor.dtype,
              "group": store.group_of.pop(cid), "version": store.versions.pop(cid),
              "state": state_to_wire(state, tensor.shape, 0, tensor.numel())}
    payload = pack(session.server.pool, [tensor])
    session.server.outbox.send(dest, header, REQUEST, payload,
                               lambda: session.server.pool.give(payload))
    session.stats["chunks_out"] += 1
    session.stats["bytes_moved_out"] += payload.nbytes


def on_adopt(session, message: dict) -> None:
    """A chunk handed over by its previous owner (``Session.dispatch`` keeps it until the
    switch that makes this server its owner)."""
    if message["cid"] not in session.incoming:
        raise ValueError(f"server {message['server']} handed over chunk {message['cid']}, "
                         f"which server {session.server.index} does not expect")
    install(session, message)
    session.store.rebuild_optimizer()
    replay(session)


def install(session, message: dict) -> None:
    cid = message["cid"]
    store = session.store
    payload = message.pop("_payload", None)
    store.chunks[cid] = unpack(payload, [(message["numel"], message["dtype"])])[0].clone()
    if payload is not None:
        session.server.pool.give(payload)
    store.versions[cid] = message["version"]
    store.group_of[cid] = message["group"]
    store.adopted_state[cid] = message["state"]
    session.incoming.discard(cid)
    session.stats["chunks_in"] += 1
