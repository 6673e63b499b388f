"""Policies on 1 server + 4 workers, each in its own PSOptimizer session of one job:
exactly-once application (ASP, eager), the SSP gate, Sync-opt drops, and scikit-learn
digits trained to comparable accuracy under every policy.

Scenario ``policies`` (run by mpi_ps_scenarios.py)."""
import time

import numpy as np
import torch

from mpi_ps_common import check
from ripples.ps.optimizer import PSOptimizer
from ripples.ps.policies import POLICIES, TASK_POLICIES

SLOW = 3


def vector_session(context, policy, steps, **kwargs):
    """A single float64 vector trained with SGD(lr=1) on integer gradients; returns the
    final vector, the metrics and the sum of this worker's pushed gradients times factor."""
    w = context.worker
    param = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context, policy=policy,
                     timeout_s=20, **kwargs)
    for step in range(steps):
        param.grad = torch.full((6,), float(w + 1), dtype=torch.float64)
        if w == SLOW:
            time.sleep(0.02)
        ps.step()
    ps.join()
    return param.detach().clone(), ps.metrics()


def exactly_once(context):
    w, comm = context.worker, context.worker_comm
    steps = 3 + w  # uneven step counts end with join()
    total_pushes = sum(3 + j for j in range(context.num_workers))
    expected = -sum((j + 1) * (3 + j) for j in range(context.num_workers))
    final, m = vector_session(context, "asp", steps)
    check(torch.equal(final, torch.full((6,), float(expected), dtype=torch.float64)),
          f"asp: final {final.tolist()} expected {expected}")
    check(m["server_load"][0]["updates"] == total_pushes, f"asp updates {m['server_load'][0]}")
    check(m["server_load"][0]["applied_per_worker"][w] == steps, "asp applied per worker")

    final, m = vector_session(context, "eager", steps)
    mine = (w + 1) * sum(count / tau for tau, count in m["expected_tau_hist"].items())
    check(sum(m["expected_tau_hist"].values()) == steps, "one tau per step")
    expected = -comm.allreduce(mine)
    check(torch.allclose(final, torch.full((6,), expected, dtype=torch.float64)),
          f"eager: final {final.tolist()} expected {expected}")
    check(m["server_load"][0]["updates"] == total_pushes, f"eager updates {m['server_load'][0]}")
    check(sum(m["staleness_hist"].values()) == total_pushes, "eager staleness recorded per update")

    final, m = vector_session(context, "eager", steps, max_lag=0)
    expected = -comm.allreduce((w + 1) * sum(c / tau for tau, c in m["expected_tau_hist"].items()))
    check(torch.allclose(final, torch.full((6,), expected, dtype=torch.float64)),
          f"eager max_lag=0: final {final.tolist()} expected {expected}")
    check(comm.allreduce(m["blocked_by_max_lag"]) > 0, "max_lag=0 must block some steps")


def ssp_gate(context):
    s = 1
    _, m = vector_session(context, "ssp", 8, staleness=s)
    gaps = [own - slowest for own, slowest in m["gate_log"]]
    check(max(gaps) <= s, f"ssp: worker started a clock {max(gaps)} ahead of the slowest (s={s})")
    _, m = vector_session(context, "asp", 8)
    gaps = context.worker_comm.allgather(max(own - slowest for own, slowest in m["gate_log"]))
    check(max(gaps) > s, f"asp control: the slow worker should have let others run ahead {gaps}")


def syncopt_drops(context):
    _, m = vector_session(context, "syncopt", 8, backup_workers=1)
    load = m["server_load"][0]
    check(m["dropped"] > 0, f"syncopt with a slow worker dropped nothing: {load}")
    check(sum(load["applied_per_worker"]) + load["dropped"] == sum(load["pushes_per_worker"]),
          f"syncopt: applied + dropped != pushed: {load}")


def digits(context):
    from sklearn.datasets import load_digits
    w, n = context.worker, context.num_workers
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.RandomState(0).permutation(len(y))
    test, train = order[:300], order[300:]
    mine = train[w::n]
    xs, ys = torch.from_numpy(x[mine]), torch.from_numpy(y[mine])
    xt, yt = torch.from_numpy(x[test]), torch.from_numpy(y[test])
    results = {}
    # CASP needs the runtime and EPSP/FlexRR a TaskSampler: mpi_ps_casp.py, mpi_ps_epsp.py.
    for policy in [p for p in POLICIES if p != "casp" and p not in TASK_POLICIES]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        kwargs = {"staleness": 1} if policy == "ssp" else {}
        # Per-push policies apply W updates where a round applies one: the usual lr / W.
        lr = 0.3 if policy in ("bsp", "syncopt", "consgd", "dynsgd") else 0.3 / n
        ps = PSOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                         model.named_parameters(), context, policy=policy, timeout_s=20, **kwargs)
        gen = torch.Generator().manual_seed(w)
        for epoch in range(6):
            perm = torch.randperm(len(ys), generator=gen)
            for start in range(0, len(ys) - 15, 16):
                idx = perm[start:start + 16]
                ps.zero_grad()
                torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
                ps.step()
        ps.join()
        with torch.no_grad():
            results[policy] = (model(xt).argmax(1) == yt).float().mean().item()
    if w == 0:
        print("digits test accuracy:", {k: round(v, 3) for k, v in results.items()}, flush=True)
    for policy, accuracy in results.items():
        # Sync-opt drops the last gradient of each round: on 2 shared cores the same worker
        # is often last, so its quarter of the data counts little (0.833 against BSP's 0.937
        # seen once in a full-suite run); 0.15 of slack keeps this a check of learning.
        check(accuracy >= 0.8 and accuracy >= results["bsp"] - 0.15,
              f"digits {policy}: accuracy {accuracy:.3f} (bsp {results['bsp']:.3f})")


def policies(context):
    check(context.num_servers == 1 and context.num_workers == 4,
          "run with 5 ranks: 1 server + 4 workers")
    exactly_once(context)
    ssp_gate(context)
    syncopt_drops(context)
    digits(context)
    if context.worker == 0:
        print("policies OK", flush=True)


SCENARIOS = {"policies": policies}
