"""Live migration, elastic scaling, PSLD and robustness of the parameter servers under
mpiexec (real processes). Each job runs once per module; each test checks its own line.

``RIPPLES_LONG_TESTS=1`` adds the real 3 GB payload (about 12 s and 6 GB of memory); the
splitting it relies on is checked without allocating in tests/test_ps_transport_units.py."""
import os
import sys

import pytest

from mpi_launch import TESTS_DIR, run_mpi

# Its module-scoped fixture runs once per test process: keep its tests in one.
pytestmark = pytest.mark.xdist_group("ps_psld")


def script(*args):
    return [sys.executable, str(TESTS_DIR / "mpi" / "mpi_ps_psld.py"), *map(str, args)]


@pytest.fixture(scope="module")
def moves_output():
    return run_mpi(script("moves"), 6, timeout=120, env={"RIPPLES_PS_SPARE": "1"}).stdout


@pytest.fixture(scope="module")
def psld_output():
    env = {"RIPPLES_PS_SPARE": "1", "RIPPLES_SERVER_SLOWDOWN": "1:4",
           "RIPPLES_SERVER_COST": "0.2:50"}
    return run_mpi(script("psld"), 5, timeout=120, env=env).stdout


def test_migration_under_concurrent_pushes_keeps_every_update(moves_output):
    assert "migration under concurrent pushes OK" in moves_output


def test_scale_out_onto_the_spare_and_scale_in(moves_output):
    assert "scale-out and scale-in OK" in moves_output


def test_a_pull_reaching_the_old_owner_is_redirected(moves_output):
    assert "redirect from the old owner OK" in moves_output


def test_bad_message_is_answered_and_the_server_keeps_serving(moves_output):
    assert "bad message answered, server still serving OK" in moves_output


def test_checkpoint_after_migrations_resumes_exactly(moves_output):
    assert "checkpoint/resume after migrations OK" in moves_output


def test_psld_moves_load_off_the_slowed_server(psld_output):
    assert "psld moves load off the slow server OK" in psld_output


def test_bad_exploration_is_rolled_back(psld_output):
    assert "rollback after a bad exploration OK" in psld_output


LONG = os.environ.get("RIPPLES_LONG_TESTS") == "1"


@pytest.mark.skipif(not LONG, reason="real 3 GB payload (about 12 s, 6 GB of memory): "
                                     "RIPPLES_LONG_TESTS=1")
def test_a_real_3_gb_payload_crosses_the_2_gib_message_limit():
    out = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "mpi_ps_big.py")], 2, timeout=150).stdout
    assert "3 GB payload in 3 messages OK" in out
