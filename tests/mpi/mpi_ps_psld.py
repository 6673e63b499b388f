"""Live migration, elastic servers and robustness of the parameter servers, under mpiexec.

Usage: mpi_ps_psld.py moves   (6 ranks: 2 servers + 1 spare, 3 workers)
       mpi_ps_psld.py psld    (5 ranks: 2 servers + 1 spare, 2 workers; run with
                               RIPPLES_SERVER_SLOWDOWN set by the caller)

``moves``: worker 0 moves chunks between steps while the other workers keep pushing
(they never wait for it); every step must equal synchronous SGD with momentum computed
locally, which fails if a push is lost or applied twice or if momentum stays behind.
Then a bad message, and a checkpoint taken after migrations resumed in a new session.
``psld``: the scheduler moves chunks off the slowed server, and rolls back explorations.
"""
import sys

import torch
from mpi4py import MPI

from mpi_ps_common import begin, check, run
from ripples.core.errors import RipplesError
from ripples.ps import psld
from ripples.ps.optimizer import PSOptimizer
from ripples.ps.transport import PROTOCOL, REQUEST

STEPS = 12


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(worker, step):
    gen = torch.Generator().manual_seed(1000 * step + worker)
    return torch.randn(5, 8, generator=gen), torch.randint(0, 3, (5,), generator=gen)


def reference_step(reference, ref_opt, comm, worker, workers, step):
    x, y = batch(worker, step)
    reference.zero_grad()
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    for p in reference.parameters():
        total = p.grad.numpy().copy()
        comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
        p.grad.copy_(torch.from_numpy(total) / workers)
    ref_opt.step()


def train_step(net, ps, worker, step):
    x, y = batch(worker, step)
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    ps.step()


def server_stats(ps):
    rids = {s: ps.channel.send(s, {"kind": "stats", "sid": ps.sid, "w": ps.worker})
            for s in ps.servers}
    return {s: ps.channel.wait(s, rid, 20, "stats")["stats"] for s, rid in rids.items()}


# Moves announced by worker 0 after these steps: (owners by rule, what it exercises).
def plan_moves(num_chunks):
    half = num_chunks // 2
    return {
        2: ([0] * half + [1] * (num_chunks - half), "rebalance between active servers"),
        4: ([c % 3 for c in range(num_chunks)], "scale out onto the spare"),
        6: ([0 if c % 2 else 2 for c in range(num_chunks)], "scale in: server 1 back to spare"),
        9: ([1] * num_chunks, "everything onto the server that was spare"),
    }


def moves():
    context, worker, workers = begin(2, timeout_s=20)
    check(context.spare == 1 and context.num_servers == 3, "2 servers + 1 spare")
    comm = context.worker_comm
    net, reference = model(), model()
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    ps = PSOptimizer(make(net), net.named_parameters(), context, policy="bsp", chunk_bytes=128)
    ref_opt = make(reference)
    n = len(ps.map.chunks)
    check(set(ps.map.owners) == {0, 1} and ps.map.members == (0, 1), "spare starts idle")
    schedule = plan_moves(n)
    seen_active = []
    for step in range(STEPS):
        train_step(net, ps, worker, step)
        reference_step(reference, ref_opt, comm, worker, workers, step)
        for (name, p), q in zip(net.named_parameters(), reference.parameters()):
            check(torch.allclose(p, q, atol=1e-6, rtol=1e-5),
                  f"worker {worker} step {step} {name} (map {ps.map.version}): max diff "
                  f"{(p - q).abs().max().item()}")
        seen_active.append(ps.map.members)
        if worker == 0 and step in schedule:
            ps.move_chunks(schedule[step][0])
    ps.join()
    stats = server_stats(ps)
    owned = sorted(c for s in stats.values() for c in s["chunks"])
    check(owned == list(range(n)), f"every chunk has exactly one owner: {owned}")
    versions = {c: v for s in stats.values() for c, v in s["versions"].items()}
    check(all(versions[c] == STEPS for c in range(n)),
          f"every chunk was updated exactly {STEPS} times: {versions}")
    for s in stats.values():
        for cid, total in s["checksum"].items():
            c = ps.map.chunks[cid]
            mine = float(net_params(net)[c.param].view(-1)[c.start:c.stop].double().sum())
            check(mine == total, f"chunk {cid} checksum: server {total}, worker {mine}")
    check(ps.map.version == 4 and ps.map.owners == tuple([1] * n), f"final map {ps.map}")
    check((0, 1, 2) in seen_active and (0, 2) in seen_active and seen_active[-1] == (1,),
          f"scale-out then scale-in: {seen_active}")
    redirects = comm.allgather(ps.stats["redirects"])
    if worker == 0:
        check(stats[2]["chunks_in"] > 0 and stats[1]["chunks_out"] > 0, "chunks moved")
        check(sum(s["redirected_pulls"] for s in stats.values()) > 0,
              "old owners saw pulls of an older map")
        check(all(r > 0 for r in redirects), f"pulls redirected by old owners: {redirects}")
        print(f"migration under concurrent pushes OK (steps equal synchronous SGD with "
              f"momentum, versions all {STEPS}, checksums equal)", flush=True)
        print(f"scale-out and scale-in OK {seen_active[::3]}", flush=True)
        print(f"redirect from the old owner OK {redirects}", flush=True)
    bad_messages(context, worker)
    checkpoint_resume(context, worker, workers)


def net_params(net):
    return [p.detach() for p in net.parameters()]


def bad_messages(context, worker):
    """Malformed requests get an error back; the server keeps serving."""
    net = model()
    ps = PSOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), net.named_parameters(), context,
                     policy="bsp", chunk_bytes=256)
    if worker == 0:
        channel = ps.channel
        rid = 10_000
        channel.outbox.send(0, {"kind": "pull", "v": PROTOCOL + 7, "rid": rid, "w": 0,
                                "sid": ps.sid}, REQUEST)
        try:
            channel.wait(0, rid, 10, "bad version")
            check(False, "a request of another protocol version must get an error")
        except RipplesError as exc:
            check("protocol version" in str(exc), f"error names the version: {exc}")
        channel.outbox.send(0, {"kind": "teleport", "v": PROTOCOL, "rid": rid + 1, "w": 0,
                                "sid": ps.sid}, REQUEST)
        try:
            channel.wait(0, rid + 1, 10, "unknown kind")
            check(False, "an unknown kind must get an error")
        except RipplesError as exc:
            check("unknown kind 'teleport'" in str(exc), f"error names the kind: {exc}")
        channel.outbox.send(0, {"kind": "push", "v": PROTOCOL, "rid": rid + 2, "w": 0,
                                "sid": ps.sid, "chunks": []}, REQUEST)
        try:
            channel.wait(0, rid + 2, 10, "push without a clock")
            check(False, "a push without its fields must get an error")
        except RipplesError as exc:
            check("needs the fields ['clock'" in str(exc), f"error names the fields: {exc}")
        channel.outbox.send(0, ["not", "a", "header"], REQUEST)
        deadline = MPI.Wtime() + 10
        while not channel.unmatched_errors and MPI.Wtime() < deadline:
            channel.drain()
        check(channel.unmatched_errors and "dict header" in channel.unmatched_errors[0][1],
              f"a header that is not a dict is answered: {channel.unmatched_errors}")
    for step in range(3):  # the servers still serve everyone
        train_step(net, ps, worker, step)
    ps.join()
    if worker == 0:
        print("bad message answered, server still serving OK", flush=True)


def checkpoint_resume(context, worker, workers):
    """A checkpoint taken after migrations, loaded into a new session, continues exactly
    like the run that was not interrupted."""
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    net = model()
    ps = PSOptimizer(make(net), net.named_parameters(), context, policy="bsp", chunk_bytes=128)
    n = len(ps.map.chunks)
    saved = None
    for step in range(8):
        train_step(net, ps, worker, step)
        if worker == 0 and step in (1, 3):
            ps.move_chunks([(c + step) % 3 for c in range(n)])
        if step == 5:
            state = ps.state_dict() if worker == 0 else None
            saved = (context.worker_comm.bcast(state, root=0),
                     [p.detach().clone() for p in net.parameters()])
    ps.join()
    uninterrupted = [p.detach().clone() for p in net.parameters()]
    check(ps.map.version == 2, f"two migrations before the end: {ps.map.version}")
    saved_owners = tuple(saved[0]["ripples"]["chunk_map"]["owners"])
    check(saved_owners == tuple(c % 3 for c in range(n)), f"checkpoint's map {saved_owners}")

    resumed = model(seed=1)
    with torch.no_grad():
        for p, q in zip(resumed.parameters(), saved[1]):
            p.copy_(q)
    ps2 = PSOptimizer(make(resumed), resumed.named_parameters(), context, policy="bsp",
                      chunk_bytes=128)
    ps2.load_state_dict(saved[0])
    check(ps2.map.owners != saved_owners, "a new session starts from its own placement")
    for step in range(6, 8):
        train_step(resumed, ps2, worker, step)
    ps2.join()
    check(ps2.map.owners == saved_owners, f"the checkpoint's chunk map is restored: {ps2.map}")
    for p, q in zip(resumed.parameters(), uninterrupted):
        check(torch.allclose(p, q, atol=1e-6, rtol=1e-5),
              f"resumed run differs: max diff {(p - q).abs().max().item()}")
    if worker == 0:
        print("checkpoint/resume after migrations OK", flush=True)


EXTRA_STEPS_FOR_A_ROLLBACK = 60


def scheduled():
    """PSLD on its own: server 1 is slowed by the caller's RIPPLES_SERVER_SLOWDOWN."""
    context, worker, workers = begin(2, timeout_s=20)
    net = torch.nn.Sequential(torch.nn.Linear(8, 2048), torch.nn.Tanh(), torch.nn.Linear(2048, 3))
    config = psld.PSLDConfig(window=3, epsilon=1.0, delta=0.1, seed=3)
    ps = PSOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), net.named_parameters(), context,
                     policy="bsp", chunk_bytes=8 << 10, psld=config)
    sizes = [c.nbytes for c in ps.map.chunks]
    start_slow = sum(s for s, o in zip(sizes, ps.map.owners) if o == 1)
    for step in range(45):
        train_step(net, ps, worker, step)
    # Whether an exploration lands on the slowed server (and so is rolled back) depends on
    # the measured times; train on, all workers alike, until worker 0 has seen a rollback.
    steps = 45
    while steps < 45 + EXTRA_STEPS_FOR_A_ROLLBACK:
        seen = worker == 0 and ps.metrics()["psld"]["counts"]["rollback"] > 0
        if context.worker_comm.bcast(seen, root=0):
            break
        train_step(net, ps, worker, steps)
        steps += 1
    ps.join()
    stats = server_stats(ps)
    owned = sorted(c for s in stats.values() for c in s["chunks"])
    check(owned == list(range(len(sizes))), "every chunk has exactly one owner")
    if worker == 0:
        summary = ps.metrics()["psld"]
        end_slow = sum(s for s, o in zip(sizes, ps.map.owners) if o == 1)
        kinds = [d["kind"] for d in summary["decisions"]]
        check(end_slow < start_slow, f"bytes on the slowed server: {start_slow} -> {end_slow} "
                                     f"({kinds})")
        check(summary["counts"]["exploit"] > 0, f"exploiting moves: {summary}")
        print(f"psld moves load off the slow server OK {start_slow} -> {end_slow} {kinds}",
              flush=True)
        rollbacks = [i for i, d in enumerate(summary["decisions"]) if d["kind"] == "rollback"]
        check(rollbacks, f"a bad exploration is rolled back: {kinds}")
        for i in rollbacks:
            check(summary["decisions"][i - 1]["kind"] == "explore"
                  and summary["decisions"][i]["chunks"] == summary["decisions"][i - 1]["chunks"],
                  f"a rollback undoes the exploration before it: {summary['decisions']}")
        print(f"rollback after a bad exploration OK ({len(rollbacks)} rollbacks in {steps} "
              "steps)", flush=True)


run({"moves": moves, "psld": scheduled}[sys.argv[1]])
