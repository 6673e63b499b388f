"""Parameter-server mode through the Horovod-style frontend, 1 server + 2 workers.

Scenarios (run by mpi_ps_scenarios.py):
  ``no servers``               before PS mode: sync="ps" without servers is a clear error
  ``frontend``                 init(ps_servers=...) and DistributedOptimizer(sync="ps"); the
                               server rank serves inside init() and never runs it
  ``documented epsp example``  the EPSP example of docs/parameter-server.md, as written (it
                               ends with hvd.shutdown(): after it, no scenario may use the
                               frontend)
"""
import warnings
from pathlib import Path

import torch

import ripples.torch as hvd
from mpi_ps_common import check

DOCS = Path(__file__).resolve().parents[2] / "docs" / "parameter-server.md"


def no_servers():
    hvd.init(ps_servers=0)
    model = torch.nn.Linear(2, 1)
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sync="ps")
        check(False, "sync='ps' without servers must raise ValueError")
    except ValueError as exc:
        print(f"rank {hvd.rank()} error: {exc}", flush=True)
    hvd.shutdown()


def frontend(context):
    hvd.init()  # the job entered PS mode through it: this returns the same runtime
    assert hvd.size() == context.num_workers == 2 and hvd.rank() in (0, 1), (hvd.rank(), hvd.size())  # workers only
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # made on the optimizer before wrapping, as Horovod scripts do
    scheduler = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), sync="ps",
                                   policy="bsp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3 + hvd.rank()):  # uneven step counts end with join()
            opt.zero_grad()
            model(torch.full((2, 4), float(hvd.rank() + 1))).sum().backward()
            opt.step()
            scheduler.step()
    assert not [w for w in caught if "lr_scheduler" in str(w.message)], \
        [str(w.message) for w in caught]
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5 ** (3 + hvd.rank()), opt.param_groups
    hvd.join()
    saved = opt.state_dict()  # the servers' momentum, one buffer per parameter
    assert sorted(saved["state"]) == [0, 1], saved["state"].keys()
    assert saved["state"][0]["momentum_buffer"].shape == model.weight.shape, saved["state"][0]
    weights = hvd.allgather_object(model.weight.detach().tolist())
    assert weights[0] == weights[1], weights  # both hold the servers' final parameters
    # the collectives of the core keep working among the workers
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 2.0
    print(f"worker {hvd.rank()} ok", flush=True)


def documented_epsp_example(context):
    text = DOCS.read_text()
    block = text.split("<!-- epsp-example -->")[1].split("<!-- /epsp-example -->")[0]
    code = block.split("```python\n")[1].split("```")[0]
    exec(compile(code, f"{DOCS} (epsp-example)", "exec"), {"__name__": "__main__"})


BEFORE_PS = {"no servers": no_servers}
SCENARIOS = {"frontend": frontend, "documented epsp example": documented_epsp_example}
