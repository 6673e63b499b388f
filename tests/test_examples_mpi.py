"""The porting guide's scripts run at 2 ranks as users run them: the Horovod script
unchanged (``horovod.torch`` answered by ripples), its ripples port with a slow rank, a
ported script shaped like Horovod's ImageNet example; each reaches a real accuracy, saves
a checkpoint on rank 0 and resumes from it."""
import os
import re
import sys

import pytest

from mpi_launch import REPO_DIR, TESTS_DIR, run_mpi

SHIMS = str(TESTS_DIR / "shims")


def run_example(script, tmp_path, epochs, env=None, args=(), private_files=False):
    """Run ``script`` on 2 ranks; ``private_files``: rank 1's checkpoint path is one where
    nothing was saved, as on a host of its own without a shared file system."""
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join([SHIMS, str(REPO_DIR)])

    def command(checkpoint):
        return [sys.executable, str(REPO_DIR / "examples" / script), "--epochs", str(epochs),
                "--checkpoint", str(checkpoint), *args]

    if private_files:  # one rank per program: mpiexec -n 1 A : -n 1 B
        argv = [*command(tmp_path / "checkpoint.pt"), ":", "-n", "1",
                *command(tmp_path / "elsewhere" / "checkpoint.pt")]
        result = run_mpi(argv, 1, timeout=180, env=env)
    else:
        result = run_mpi(command(tmp_path / "checkpoint.pt"), 2, timeout=180, env=env)
    return re.findall(r"^epoch (\d+) steps (\d+) val_accuracy (\S+) time \S+s$", result.stdout, re.M)


@pytest.mark.parametrize("script,env,args", [
    ("epochs_horovod.py", {}, ()),
    # DataLoader worker processes forked after init, beside ripples' threads; the sampler
    # hands out batches ahead of the steps (the loader prefetches them)
    ("epochs_ripples.py", {"RIPPLES_SLOWDOWN": "1:3", "RIPPLES_COMPUTE_MS": "2"},
     ("--loader-workers", "2")),
    # Horovod's ImageNet example's shape: metrics all-reduced every batch, which pair up
    # although the shared epoch gives the ranks different numbers of steps
    ("metrics_every_batch.py", {"RIPPLES_SLOWDOWN": "1:3", "RIPPLES_COMPUTE_MS": "2"}, ()),
])
def test_epoch_script_trains_saves_and_resumes(script, env, args, tmp_path):
    first = run_example(script, tmp_path, 3, env, args)
    assert [int(e) for e, _, _ in first] == [0, 1, 2]
    assert float(first[-1][2]) > 0.85, first  # 10 classes: chance is 0.1
    assert (tmp_path / "checkpoint.pt").exists()
    # Only rank 0 finds the checkpoint (no shared file system): rank 1 gets it from rank 0.
    resumed = run_example(script, tmp_path, 4, env, args, private_files=True)
    assert [int(e) for e, _, _ in resumed] == [3]  # started after the saved epoch
    assert float(resumed[0][2]) > 0.85, resumed


def test_the_elastic_script_trains_and_saves(tmp_path):
    result = run_mpi([sys.executable, str(REPO_DIR / "examples" / "epochs_elastic.py"),
                      "--epochs", "3", "--checkpoint", str(tmp_path / "checkpoint.pt")], 2,
                     timeout=180)
    epochs = re.findall(r"^epoch (\d+) size (\d+) val_accuracy (\S+) time \S+s$",
                        result.stdout, re.M)
    assert [(int(e), int(s)) for e, s, _ in epochs] == [(0, 2), (1, 2), (2, 2)], result.stdout
    assert float(epochs[-1][2]) > 0.85, epochs  # 10 classes: chance is 0.1
    assert (tmp_path / "checkpoint.pt").exists()
