"""No pickled ``allreduce`` or ``scan`` of mpi4py in ripples: they keep the GIL while they wait.

Measured with mpi4py 4.1 (2 ranks, one 2 s late): during ``comm.allreduce(1, op=MPI.MIN)``
and ``comm.scan(1, op=MPI.SUM)`` a second Python thread of the waiting rank ran once in
2 s; during ``allgather``, ``bcast``, ``reduce``, ``exscan``, ``gather``, ``scatter``,
``alltoall``, ``barrier``, ``recv``, ``sendrecv``, ``probe``, ``mprobe``, ``Recv``,
a request's ``Wait`` and the buffer ``Allreduce`` it ran every 0.1 s. ripples' watch
threads (the data-phase watch, the liveness responder) must run while a rank waits, or a
frozen member leaves the others waiting for good (as the end of ``join()`` once did:
``tests/test_fail_fast_mpi.py``, place ``join``). The check finds the form that takes an MPI
op, ``x.allreduce(..., op=MPI.<OP>)`` (or ``scan``); the buffer calls are the alternative.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ripples"


GIL_HOLDING = ("allreduce", "scan")


def gil_holding_calls(source: str):
    """Line numbers of ``<expr>.allreduce(..., op=MPI.<name>)`` (or ``scan``) calls in
    ``source``."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in GIL_HOLDING):
            for keyword in node.keywords:
                value = keyword.value
                if (keyword.arg == "op" and isinstance(value, ast.Attribute)
                        and isinstance(value.value, ast.Name) and value.value.id == "MPI"):
                    yield node.lineno


def test_the_check_finds_the_pickled_form_and_passes_the_others():
    source = ("last = rt.ctl.allreduce(rank, op=MPI.MAX)\n"
              "rt.ctl.Allreduce(MPI.IN_PLACE, last, op=MPI.MAX)\n"
              "hvd.allreduce(tensor, op=hvd.Sum)\n"
              "offset = comm.scan(count, op=MPI.SUM)\n")
    assert list(gil_holding_calls(source)) == [1, 4]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_pickled_allreduce_with_an_mpi_op(path):
    lines = list(gil_holding_calls(path.read_text()))
    assert not lines, (f"{path.relative_to(PACKAGE)}:{lines}: mpi4py's pickled allreduce keeps "
                       "the GIL while it waits; use the buffer Allreduce (or Scan)")
