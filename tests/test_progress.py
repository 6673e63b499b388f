"""Progress output: a bar on a terminal, plain lines (no escape sequences) anywhere else."""
import io
import os
import subprocess
import sys

import pytest

from ripples.observe.progress import PlainProgress, progress_bar


def lines(stream):
    return stream.getvalue().splitlines()


def test_one_line_per_step_percent_of_progress():
    out = io.StringIO()
    bar = PlainProgress(20, "allreduce", unit="s", stream=out, step_percent=25)
    for _ in range(20):
        bar.update(1)
    bar.close()                                         # 100% already written
    assert lines(out) == ["allreduce: 5/20 s (25%)", "allreduce: 10/20 s (50%)",
                          "allreduce: 15/20 s (75%)", "allreduce: 20/20 s (100%)"]


def test_a_jump_over_several_steps_writes_one_line_and_close_writes_the_end():
    out = io.StringIO()
    bar = PlainProgress(4, "sim", stream=out)           # 10% steps, no unit
    bar.update(0.3)                                     # 7.5%: nothing yet
    assert lines(out) == []
    bar.update(1.7)                                     # 50%
    bar.update(0.1)                                     # 52.5%: the 60% line is next
    bar.update(0.4)                                     # 62.5%
    bar.close()
    bar.close()                                         # nothing new to say
    assert lines(out) == ["sim: 2.0/4.0 (50%)", "sim: 2.5/4.0 (62%)"]
    assert bar.n == pytest.approx(2.5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="total must be > 0"):
        PlainProgress(0, "x")
    with pytest.raises(ValueError, match="step_percent"):
        PlainProgress(1, "x", step_percent=0)


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_and_anything_else_plain_lines():
    from tqdm import tqdm
    bar = progress_bar(10, "demo", unit="s", stream=FakeTerminal())
    assert isinstance(bar, tqdm)
    bar.close()
    assert isinstance(progress_bar(10, "demo", stream=io.StringIO()), PlainProgress)


def test_demo_progress_in_a_log_is_plain_lines(tmp_path):
    """The demo on one process, stderr to a pipe: the lines of its progress, no escapes."""
    result = subprocess.run(
        [sys.executable, "-m", "ripples.demo", "--seconds", "1", "--modes", "allreduce",
         "--compute-ms", "5", "--plot", str(tmp_path / "p.png")], capture_output=True,
        text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("allreduce: ")]
    assert progress and progress[-1] == "allreduce: 1.0/1.0 s (100%)", result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
