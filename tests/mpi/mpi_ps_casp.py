"""CASP (communities) under mpiexec with 1 server.

Scenarios (run by mpi_ps_scenarios.py, in PS mode: the workers' runtime is there):
  ``casp equivalence``  (5 ranks: 4 workers) C=1 is BSP step by step; C=n is ASP;
                        regrouping from measured speeds loses and repeats no update
                        (checksum) and finds the two speed classes
  ``casp uneven``       (5 ranks: 4 workers of two speeds) every worker stops on its own
                        clock, after a regrouping: no one waits for a finished member, and
                        every round is averaged over the members still training
  ``casp epochs``       (5 ranks: 4 workers, worker 3 slow) a user's epoch loop: a fixed
                        number of steps per epoch and an all-reduce of a metric after each,
                        while re-formed communities put members of different step counts
                        together: every epoch ends in the all-reduce on every worker
  ``casp failure``      (4 ranks: 3 workers, communities (0,) and (1, 2)): worker 2 stalls,
                        worker 1 gets a timeout naming it, worker 0 keeps training alone
                        (last in its job: it restarts the workers' runtime without PS mode)
"""
import time

import torch

from mpi_ps_common import check, restart_workers_runtime, small_model
from ripples.core.errors import RipplesTimeoutError
from ripples.ps.optimizer import PSOptimizer


def one_community_is_bsp(context):
    worker = context.worker
    models = [small_model(seed=worker) for _ in range(2)]
    opts = [PSOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), m.named_parameters(),
                        context, timeout_s=20, **kw)
            for m, kw in zip(models, ({"policy": "casp", "communities": 1}, {"policy": "bsp"}))]
    gen = torch.Generator().manual_seed(100 + worker)
    for step in range(5):
        x, y = torch.randn(5, 8, generator=gen), torch.randint(0, 3, (5,), generator=gen)
        for m, o in zip(models, opts):
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
        for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
            check(torch.allclose(p, q, atol=1e-6, rtol=1e-5),
                  f"C=1 vs BSP step {step} {name}: max diff {(p - q).abs().max().item()}")
    for o in opts:
        o.join()
    casp, bsp = (o.metrics() for o in opts)
    check(casp["communities"] == [[0, 1, 2, 3]], f"one community: {casp['communities']}")
    pushed = context.worker_comm.allgather(casp["bytes_pushed"])
    bsp_pushed = context.worker_comm.allgather(bsp["bytes_pushed"])
    check(pushed[1:] == [0, 0, 0] and pushed[0] == bsp_pushed[0],
          f"only the leader pushes, as much as one BSP worker: {pushed} vs {bsp_pushed}")
    check(casp["server_load"][0]["updates"] == 5, "one update per round")


def one_community_each_is_asp(context):
    """Integer gradients and lr=1: the final parameters are exact under any arrival order."""
    worker, workers = context.worker, context.num_workers
    finals, pushed = [], []
    for kw in ({"policy": "casp", "communities": workers}, {"policy": "asp"}):
        param = torch.nn.Parameter(torch.zeros(6))
        ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context,
                         timeout_s=20, **kw)
        for step in range(4 + worker):
            time.sleep(0.002 * (worker + 1))
            param.grad = torch.full((6,), float((worker + 1) * (step + 1)))
            ps.step()
        ps.join()
        m = ps.metrics()
        finals.append(param.detach().clone())
        pushed.append(m["bytes_pushed"])
        if kw["policy"] == "casp":
            check(m["community"]["collective_s"] == 0.0, "a community of one runs no collective")
            check(m["server_load"][0]["updates"] == sum(4 + w for w in range(workers)),
                  "every push applied on arrival")
    expected = -sum((w + 1) * (s + 1) for w in range(workers) for s in range(4 + w))
    check(torch.equal(finals[0], torch.full((6,), float(expected))), f"C=n final {finals[0]}")
    check(torch.equal(finals[0], finals[1]) and pushed[0] == pushed[1],
          f"C=n and ASP: {finals}, pushed {pushed}")


def regrouping_keeps_every_update(context):
    """Speeds {fast, fast, slow, slow}: communities start as one, are re-formed from the
    measured speeds, and the servers apply exactly the updates the communities made."""
    worker, workers = context.worker, context.num_workers
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context,
                     timeout_s=20, policy="casp", communities="projected", regroup_every=2)
    share = torch.zeros(5, dtype=torch.float64)  # this worker's part of what was applied
    # The same number of rounds on every worker, as CASP requires: a loop that ends on
    # each worker's own clock let one member of a community stop a round before the other,
    # which then waited for it for good (1 of 2 full-suite runs).
    rounds = 0
    while rounds < 60:
        time.sleep(0.02 if worker < 2 else 0.06)
        param.grad = torch.arange(1, 6, dtype=torch.float64) * (worker + 1) + rounds
        members = len(ps.community.members)
        ps.step()
        share += param.grad / members  # the community's average, split among its members
        rounds += 1
    ps.join()
    m = ps.metrics()
    total = sum(context.worker_comm.allgather(share))
    check(torch.allclose(param.detach(), -total, rtol=0, atol=1e-9),
          f"checksum: servers hold {param.tolist()}, the communities pushed {(-total).tolist()}")
    check(m["community"]["plans"][-1][1] == [[0, 1], [2, 3]],
          f"sort-and-cut finds the speed classes: {m['community']['plans']}")
    check(m["server_load"][0]["plan_version"] >= 1, "at least one regrouping happened")
    check(m["community"]["rounds"] == rounds, "one round per step")
    if worker == 0:
        print(f"casp plans {m['community']['plans']} rounds/worker "
              f"{context.worker_comm.allgather(rounds)}", flush=True)
    else:
        context.worker_comm.allgather(rounds)


def progress_explores_and_keeps_every_update(context):
    """communities="auto" with losses reported: it starts as ASP, tries other counts,
    commits to one, and the servers apply exactly what the communities pushed, each push
    weighed by its community's size (a worker's share of an update is its gradient / n)."""
    worker, workers = context.worker, context.num_workers
    param = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context,
                     timeout_s=20, policy="casp", communities="auto", regroup_every=2)
    check(len(ps.community.plan) == workers, f"starts as ASP: {ps.community.plan}")
    share = torch.zeros(5, dtype=torch.float64)
    for rounds in range(60):
        time.sleep(0.02 if worker < 2 else 0.06)
        param.grad = torch.arange(1, 6, dtype=torch.float64) * (worker + 1) + rounds
        share += param.grad / workers  # before step(): the round sums gradients in place
        ps.report_loss(1.0 / (1 + rounds))
        ps.step()
    ps.join()
    m = ps.metrics()
    total = sum(context.worker_comm.allgather(share))
    check(torch.allclose(param.detach(), -total, rtol=0, atol=1e-9),
          f"checksum: servers hold {param.tolist()}, the communities pushed {(-total).tolist()}")
    history = m["server_load"][0]["plan_history"]
    counts = [len(plan) for _, plan in history]
    # ASP, then two communities (BSP is pruned: the slow pair halves its throughput), ASP
    check(counts[:3] == [workers, 2, workers], f"explored ASP, 2, ASP: {history}")
    windows = m["server_load"][0]["casp_windows"]
    check([w["count"] for w in windows][:2] == [workers, 2]
          and all(w["batch_rate"] > 0 for w in windows), f"windows measured: {windows}")
    if worker == 0:
        print(f"casp auto plans {counts}", flush=True)


def equivalence(context):
    one_community_is_bsp(context)
    one_community_each_is_asp(context)
    regrouping_keeps_every_update(context)
    progress_explores_and_keeps_every_update(context)
    if context.worker == 0:
        print("casp equivalence OK", flush=True)


def uneven(context):
    """Worker w trains for 0.6 + 0.4 w seconds, so communities lose members one by one.
    Every gradient is ones, so each applied round must apply exactly ones: dividing by a
    community's size instead of its members still training leaves a fraction."""
    worker = context.worker
    param = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context,
                     timeout_s=20, policy="casp", communities="projected", regroup_every=2)
    steps, began = 0, time.monotonic()
    while time.monotonic() - began < 0.6 + 0.4 * worker:
        time.sleep(0.01 if worker < 2 else 0.03)
        param.grad = torch.ones(3, dtype=torch.float64)
        ps.step()
        steps += 1
    ps.join()
    m = ps.metrics()
    applied = -param.detach()[0].item()
    all_steps = context.worker_comm.allgather(steps)
    check(torch.equal(param.detach(), torch.full((3,), -applied, dtype=torch.float64))
          and applied == int(applied), f"each round applies exactly one unit: {param.tolist()}")
    check(applied == m["server_load"][0]["updates"], f"{applied} vs server updates "
          f"{m['server_load'][0]['updates']}")
    # Each of a worker's steps is its own applied round; a round holds at most 4 steps.
    check(max(all_steps) <= applied <= sum(all_steps), f"{applied} rounds for steps {all_steps}")
    check(m["server_load"][0]["plan_version"] >= 1, "a regrouping happened before the leaving")
    check(m["community"]["rounds"] == steps, "leaving rounds are not counted as steps")
    if worker == 0:
        print(f"casp uneven OK: steps {all_steps}, {int(applied)} rounds applied, plans "
              f"{m['community']['plans']}", flush=True)


def epochs(context):
    """Communities {0, 1} and {2, 3} (worker 3 three times slower) are re-formed by speed to
    {0, 1, 2} and {3}. {0, 1} takes the plan steps ahead of worker 2, so at an epoch's end
    workers 0 and 1 call the all-reduce while worker 2 still needs them for rounds: unless
    the community first brings its members to the same step, that all-reduce fails."""
    from ripples.core.reduce_ops import ReduceOp
    from ripples.ops import collectives
    worker = context.worker
    param = torch.nn.Parameter(torch.zeros(3))
    ps = PSOptimizer(torch.optim.SGD([param], lr=0.01), [("v", param)], context,
                     timeout_s=20, policy="casp", communities=2, regroup_every=3)
    steps_per_epoch, epochs_run = 11, 4
    for epoch in range(epochs_run):
        for _ in range(steps_per_epoch):
            time.sleep(0.03 if worker == 3 else 0.01)
            param.grad = torch.ones(3)
            ps.step()
        steps = collectives.allreduce(torch.tensor([float(ps.stats["steps"])]),
                                      op=ReduceOp.SUM, name=f"epoch.{epoch}")
        check(steps.item() == 4 * steps_per_epoch * (epoch + 1),
              f"epoch {epoch}: steps summed {steps.item()}")
    plans = ps.community.stats["plans"]
    ps.join()
    versions = ps.metrics()["server_load"][0]["plan_version"]
    check(versions >= 1, f"the communities were re-formed: plans {plans}")
    if worker == 0:
        print(f"casp epochs OK: plans {plans}", flush=True)


def failure(context):
    timeout = 2.0
    # The stalled member sleeps, standing for a dead one: that takes the strict rule (with
    # the liveness check its community would wait for it, as it is alive).
    restart_workers_runtime(context, timeout_s=timeout, wait_for_busy_peers=False)
    worker = context.worker
    param = torch.nn.Parameter(torch.zeros(4))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context,
                     timeout_s=timeout, policy="casp", communities=2, regroup_every=10_000)
    check([list(c) for c in ps.community.plan] == [[0], [1, 2]], f"plan {ps.community.plan}")
    for _ in range(2):
        param.grad = torch.ones(4)
        ps.step()
    if worker == 2:
        time.sleep(timeout + 1.5)  # stalls; never makes its third step
    elif worker == 1:
        began = time.monotonic()
        try:
            param.grad = torch.ones(4)
            ps.step()
            check(False, "a stalled member must make its community fail")
        except RipplesTimeoutError as exc:
            waited = time.monotonic() - began
            check("[2]" in str(exc) and "partial_allreduce" in str(exc), f"names worker 2: {exc}")
            check(waited < timeout + 3, f"error after {waited:.1f} s")
    else:
        steps = 0
        began = time.monotonic()
        while time.monotonic() - began < timeout + 1:
            param.grad = torch.ones(4)
            ps.step()
            steps += 1
            time.sleep(0.01)
        check(steps > 20, f"the other community carries on: {steps} steps during the stall")
    if worker == 2:
        # Its partner gave up on it: the leaving round fails naming worker 1, after this
        # worker joined the servers (nobody waits for it).
        try:
            ps.join()
            check(False, "a community whose partner gave up cannot leave cleanly")
        except RipplesTimeoutError as exc:
            check("rank 1" in str(exc), f"names worker 1: {exc}")
            check(ps.joined, "joined the servers despite the failed community")
    else:
        ps.join()
    if worker == 0:
        m = ps.metrics()
        print(f"casp failure OK: worker 0 pushed {m['server_load'][0]['pushes_per_worker']}",
              flush=True)


SCENARIOS = {"casp equivalence": equivalence, "casp uneven": uneven, "casp epochs": epochs,
             "casp failure": failure}
