"""EPSP and FlexRR-lite tasks under mpiexec (1 server + 3 workers; worker 2 is 5x slow).

Scenario ``epsp`` (run by mpi_ps_scenarios.py).

The loss is linear in the parameters, so a task's gradient is the mean of its samples
whatever parameters it was computed on: the servers' final parameters are then exact
functions of which tasks were applied, and a task lost or applied twice shows. Every
worker computes the expected parameters itself from the task ids (``TaskSampler.indices``).
"""
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from mpi_ps_common import check
from ripples.ps import TaskSampler
from ripples.ps.optimizer import PSOptimizer

SAMPLES, MICRO, TASKS, CLOCKS = 50, 4, 18, 8


def data():
    gen = torch.Generator().manual_seed(7)
    return torch.randint(-4, 5, (SAMPLES, 3), generator=gen).double()


def session(context, policy, staleness, **kw):
    worker = context.worker
    x = data()
    param = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    ps = PSOptimizer(torch.optim.SGD([param], lr=0.5), [("w", param)], context, policy=policy,
                     staleness=staleness, tasks_per_clock=TASKS, timeout_s=20, **kw)
    sampler = TaskSampler(ps, SAMPLES, MICRO, seed=3)
    loader = DataLoader(TensorDataset(x), batch_sampler=sampler)
    expected = torch.zeros(3, dtype=torch.float64)
    for clock in range(CLOCKS):
        for (batch,) in loader:
            time.sleep(0.05 if worker == 2 else 0.01)
            (batch @ param).mean().backward()
        ps.step()
        step_grad = sum(x[sampler.indices(clock, j)].mean(0) for j in range(TASKS)) / TASKS
        expected -= 0.5 * step_grad
        if staleness == 0:
            check(torch.allclose(param.detach(), expected, rtol=0, atol=1e-12),
                  f"{policy} s=0 clock {clock}: {param.tolist()} != {expected.tolist()}")
    ps.join()
    check(torch.allclose(param.detach(), expected, rtol=0, atol=1e-12),
          f"{policy} s={staleness} final: {param.tolist()} != {expected.tolist()}")
    m = ps.metrics()
    logs = context.worker_comm.allgather(m["tasks"]["task_log"])
    everything = sorted(t for log in logs for t in log)
    check(everything == [(c, j) for c in range(CLOCKS) for j in range(TASKS)],
          f"every task computed exactly once: {everything}")
    board = m["task_board"]
    check(m["server_load"][0]["tasks_applied"] == CLOCKS * TASKS, "all tasks applied")
    for c, accounting in m["server_load"][0]["task_accounting"].items():
        if c < CLOCKS:
            check(accounting["done"] == list(range(TASKS)), f"clock {c}: {accounting}")
    return board, m


def training_patterns(context, staleness):
    """A user's loop on EPSP: a StepLR schedule stepped per clock, a frozen parameter, and an
    evaluation pause of 1 s on worker 1 between two clocks (slow, not dead). The loss is
    linear, so the final parameters are exact: minus the sum over clocks of the scheduled
    rate times the clock's global-batch gradient, whatever staleness."""
    worker = context.worker
    x = data()
    param = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    frozen = torch.nn.Parameter(torch.ones(2, dtype=torch.float64), requires_grad=False)
    ps = PSOptimizer(torch.optim.SGD([param, frozen], lr=0.5), [("w", param), ("f", frozen)],
                     context, policy="epsp", staleness=staleness, tasks_per_clock=TASKS,
                     timeout_s=20)
    schedule = torch.optim.lr_scheduler.StepLR(ps, step_size=3, gamma=0.5)
    sampler = TaskSampler(ps, SAMPLES, MICRO, seed=5)
    expected = torch.zeros(3, dtype=torch.float64)
    for clock in range(CLOCKS):
        for indices in sampler:
            time.sleep(0.03 if worker == 2 else 0.005)
            (x[indices] @ param + frozen.sum()).mean().backward()
        ps.step()
        rate = 0.5 * 0.5 ** (clock // 3)
        expected -= rate * sum(x[sampler.indices(clock, j)].mean(0) for j in range(TASKS)) / TASKS
        schedule.step()
        if clock == 3 and worker == 1:
            time.sleep(1.0)
    ps.join()
    check(torch.allclose(param.detach(), expected, rtol=0, atol=1e-12),
          f"patterns s={staleness}: {param.tolist()} != {expected.tolist()}")
    check(torch.equal(frozen.detach(), torch.ones(2, dtype=torch.float64)),
          f"patterns s={staleness}: the frozen parameter moved: {frozen.tolist()}")
    if worker == 0:
        print(f"epsp patterns s={staleness} OK", flush=True)


def epsp(context):
    worker = context.worker
    check(context.num_servers == 1 and context.num_workers == 3, "run with 4 ranks: 1 server")
    for staleness in (0, 2):
        training_patterns(context, staleness)
    results = {}
    for policy, staleness, kw in (("epsp", 0, {"rebalance_every": 4}),
                                  ("epsp", 2, {"rebalance_every": 4}),
                                  ("flexrr", 2, {})):
        board, m = session(context, policy, staleness, **kw)
        results[(policy, staleness)] = board
    epsp0 = results[("epsp", 0)]
    shares = epsp0["shares_log"][-1][1]
    check(shares[2] < shares[0] and shares[2] < shares[1] and sum(shares) == TASKS,
          f"rebalanced shares follow speed: {epsp0['shares_log']}")
    check(epsp0["transfers"] > 0, f"tasks moved from the slow worker: {epsp0}")
    flexrr = results[("flexrr", 2)]
    check(all(s == [6, 6, 6] for _, s in flexrr["shares_log"]), "FlexRR-lite keeps equal shares")
    # With slack the fast workers block only 2 clocks ahead, when the slow one has claimed
    # what is left of its current clock: the moves come from its later clocks.
    check(flexrr["transfers"] > 0, f"FlexRR-lite moved tasks under slack: {flexrr}")
    if worker == 0:
        print(f"epsp OK transfers s=0 {epsp0['transfers']} s=2 {results[('epsp', 2)]['transfers']}"
              f" flexrr {flexrr['transfers']} shares {shares}", flush=True)


SCENARIOS = {"epsp": epsp}
