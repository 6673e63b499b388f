"""Every benchmark's command line still starts: the smallest real run of those whose smoke
run takes seconds, each writing JSON that names its command, date and machine (what the
documentation quotes), and ``--help`` of the others. ``collectives.py`` and
``latency_after_idle.py`` run for real in their own test files. Behaviour only: nothing
here depends on how fast the machine is."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import REPO_DIR, mpi_env, run_mpi

# Its module-scoped fixture runs once per test process: keep its tests in one.
pytestmark = pytest.mark.xdist_group("bench_entry_points")

BENCHMARKS = REPO_DIR / "benchmarks"
# Those with no smoke run below (a real run takes tens of seconds or more ranks than fit).
SCRIPTS = ("train", "step", "generator_service_cpu", "fault_tolerance", "kernels", "sim_hosts",
           "host_faults")


@pytest.fixture(scope="module")
def helps():
    """``--help`` of those scripts, started at once (some import torch and MPI first)."""
    running = {name: subprocess.Popen([sys.executable, str(BENCHMARKS / f"{name}.py"), "--help"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=mpi_env(), cwd=REPO_DIR)
               for name in SCRIPTS}
    return {name: (proc.communicate(timeout=120)[0], proc.returncode)
            for name, proc in running.items()}


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(helps, name):
    out, code = helps[name]
    assert code == 0, out
    assert out.startswith("usage:") and f"{name}.py" in out.splitlines()[0], out


def run(tmp_path, *argv, timeout=120):
    """``python benchmarks/ARGV...`` with ``--json`` into ``tmp_path``; the JSON written."""
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, *map(str, argv), "--json", str(out)],
                          capture_output=True, text=True, timeout=timeout, env=mpi_env(),
                          cwd=REPO_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def check_stamp(data, script, *words):
    """The result names the command it came from (script and arguments), a date and a
    machine."""
    assert f"python benchmarks/{script}" in data["command"]
    for word in words:
        assert word in data["command"]
    assert data["date"][:2] == "20" and data["machine"] and data["cores"] >= 1


def test_generator_scale(tmp_path):
    data = run(tmp_path, "benchmarks/generator_scale.py", "--workers", "8", "--seconds", "0.5")
    check_stamp(data, "generator_scale.py", "--workers 8")
    assert [r["policy"] for r in data["rows"]] == ["ready", "all"]


def test_casp_controller_evaluation_writes_where_asked(tmp_path):
    data = run(tmp_path, "benchmarks/train_casp_controller.py", "--evaluate")
    check_stamp(data, "train_casp_controller.py", "--evaluate")
    assert {"classes_1_1/3", "one_3x_slow"} <= set(data["mixes"])


def test_ps_transport_launches_its_own_job(tmp_path):
    data = run(tmp_path, "benchmarks/ps.py", "--transport", "--model-mb", "1", "--repeats", "1")
    # Written by a rank of the job it launched, quoting the line that was typed.
    assert "mpiexec" not in data["command"]
    check_stamp(data, "ps.py", "--transport")
    assert data["values_match"] is True and data["args"]["transport"] is True


def test_epochs_one_epoch_of_allreduce(tmp_path):
    data = run(tmp_path, "benchmarks/epochs.py", "--np", "2", "--epochs", "1", "--repeats", "1",
               "--scenarios", "homogeneous", "--modes", "allreduce", "--compute-ms", "1")
    check_stamp(data, "epochs.py", "--np 2")
    row = data["scenarios"]["homogeneous"]["modes"]["allreduce"]
    assert row["time_vs_allreduce"] == 1.0 and len(row["runs"]) == 1


def test_epochs_horovod_row_is_the_unchanged_script_padded_before_backward(tmp_path):
    """The horovod row's script is examples/epochs_horovod.py plus emulated compute only,
    padded between the forward pass and backward() (as the DDP row: no communication of
    any row overlaps the padding), from the timed loop's start."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import epochs
    finally:
        sys.path.remove(str(BENCHMARKS))
    command = epochs.write_scripts(tmp_path)["horovod"]
    assert Path(command[0]).stem != "horovod"  # the script's folder comes first on sys.path
    padded = Path(command[0]).read_text()
    original = (BENCHMARKS.parent / "examples" / "epochs_horovod.py").read_text()
    assert "\nimport horovod.torch as hvd\n" in padded and "\nimport ripples" not in padded
    lines = [line.strip() for line in padded.splitlines()]
    added = [line for line in lines if line not in [o.strip() for o in original.splitlines()]]
    assert added == [
        "from ripples.core.config import Config as _Config",
        "from ripples.core.heterogeneity import SlowdownInjector as _Injector",
        "_injector = _Injector.from_config(_Config.load(), hvd.rank(), hvd.size())",
        "_step_end = time.perf_counter()",
        "_loss = F.cross_entropy(model(data), target)",
        "_injector.finish_step(time.perf_counter() - _step_end)",
        "_loss.backward()",
        "_step_end = time.perf_counter()"]
    began = lines.index("began = time.perf_counter()")
    assert lines[began + 1] == "_step_end = time.perf_counter()"
    assert "F.cross_entropy(model(data), target).backward()" not in lines
    compile(padded, "horovod_row.py", "exec")


def test_half_allreduce_under_mpiexec(tmp_path):
    out = tmp_path / "half.json"
    run_mpi([sys.executable, str(BENCHMARKS / "half_allreduce.py"), "--numel", "64",
             "--repeats", "1", "--json", str(out)], 2, timeout=120)
    data = json.loads(out.read_text())
    assert "mpiexec -n 2 python" in data["command"] and data["ranks"] == 2
    assert len(data["median_us"]) >= 3 and all(us > 0 for us in data["median_us"].values())


def test_every_benchmark_module_imports():
    """The modes not run above (``ps.py --scenarios``, ``--psld``, the default policies) live
    in modules of their own: each must at least import."""
    code = ("import importlib, pkgutil, sys\n"
            "for package in ('harness', 'collectives', 'ps', 'service_cpu'):\n"
            "    found = importlib.import_module(package)\n"
            "    for module in pkgutil.iter_modules(found.__path__):\n"
            "        importlib.import_module(f'{package}.{module.name}')\n"
            "        print(f'{package}.{module.name}')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=mpi_env(), cwd=BENCHMARKS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {"ps.policies", "ps.scenarios", "ps.psld", "ps.transport",
            "collectives.plugins"} <= set(done.stdout.split())


def test_link_on_one_host(tmp_path):
    """``link.py`` without ``--netcluster``: both ranks on this host, so only the intra-host
    link is fitted and no stream crosses hosts."""
    data = run(tmp_path, "benchmarks/link.py", "--np", "2", "--iterations", "1",
               "--model-mb", "1")
    check_stamp(data, "link.py", "--np 2")
    assert list(data["links"]) == ["intra"] and data["links"]["intra"]["latency_us"] > 0
    assert data["stream_gbps"] == {} and len(data["allreduce_s"]) == 3
