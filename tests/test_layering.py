"""The lower layers import nothing from the layers above them."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ripples"
UPPER = ("ripples.ops", "ripples.ps", "ripples.torch", "ripples.startup", "ripples.runner",
         "ripples.sim", "ripples.schedule")


def imported_modules(path: Path):
    """Every module ``path`` imports, at module level or inside functions."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@pytest.mark.parametrize("path", [PACKAGE / "runtime.py", *sorted((PACKAGE / "comm").glob("*.py"))],
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_runtime_and_comm_do_not_import_the_layers_above(path):
    upward = [m for m in imported_modules(path) if m.startswith(UPPER)]
    assert not upward, f"{path.name} imports {upward}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "schedule").glob("*.py")),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_schedules_do_not_import_the_simulator(path):
    upward = [m for m in imported_modules(path) if m.startswith("ripples.sim") or m.startswith("..sim")]
    assert not upward, f"{path.name} imports {upward}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "sim").glob("*.py")),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_simulator_imports_only_the_schedules_of_ripples(path):
    # relative imports appear as their bare module name ("schedule", "schedule.base")
    foreign = [m for m in imported_modules(path)
               if m.startswith(("ripples.ops", "ripples.comm", "ripples.torch", "ripples.ps",
                                "ripples.runtime", "mpi4py", "torch"))]
    assert not foreign, f"{path.name} imports {foreign}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "core").glob("*.py")),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_core_imports_nothing_of_ripples_but_core(path):
    foreign = [m for m in imported_modules(path)
               if m.startswith("ripples") and not m.startswith("ripples.core")]
    assert not foreign, f"{path.name} imports {foreign}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "observe").glob("*.py")),
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_observability_sits_below_the_collectives(path):
    upward = [m for m in imported_modules(path) if m.startswith(UPPER + ("ripples.runtime",))]
    assert not upward, f"{path.name} imports {upward}"
