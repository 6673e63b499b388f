"""What every ``DistributedOptimizer`` mode shares: metrics, injected slowdown, timeline,
the step counter, Horovod's ``synchronize``/``skip_synchronize`` surface, and the error
raised when gradients are misused between two steps."""
from __future__ import annotations

import contextlib
import time

from ripples import runtime as _runtime
from ripples.core.heterogeneity import SlowdownInjector
from ripples.observe.metrics import RankMetrics
from ripples.core.optim_wrapper import OptimizerWrapper


class GradientsPendingError(AssertionError):
    """Gradients were produced and not yet synchronized when that was not allowed:
    ``zero_grad()`` before ``step()``/``synchronize()``, or more backward passes than
    ``backward_passes_per_step`` before ``step()``.

    An ``AssertionError``, as Horovod raises there, so scripts that catch it keep working.
    """


class WrappedOptimizer(OptimizerWrapper):
    """The user's optimizer plus what every mode records.

    ``named`` is the list of ``(name, parameter)`` this wrapper keeps in step across ranks,
    in the optimizer's parameter order.
    """

    def __init__(self, optimizer, named):
        super().__init__(optimizer)
        self._named = named
        rt = _runtime.current()
        self._runtime = rt
        self.metrics = RankMetrics(rt.rank)
        self._injector = SlowdownInjector.from_config(rt.config, rt.rank, rt.size)
        self._step_end = time.perf_counter()
        self._compute_open = True
        self._should_synchronize = True
        self._steps = 0
        if rt.config.metrics_path:
            rt.at_shutdown(lambda: self.metrics.write_json(rt.config.metrics_path))

    def synchronize(self) -> None:
        """Finish this rank's gradient communication for the coming ``step()``."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Context manager: ``step()`` inside it does not synchronize gradients again.

        Horovod's pattern for work between synchronization and the update::

            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with opt.skip_synchronize():
                opt.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _finish_compute(self) -> None:
        """Close the compute phase of a step (once): emulated compute, injected slowdown."""
        if not self._compute_open:
            return
        self._compute_open = False
        communication = self._communication_in_compute()
        self.metrics.add_wait(communication)
        elapsed = time.perf_counter() - self._step_end - communication
        if self._injector.enabled:
            start = time.perf_counter()
            self._injector.finish_step(elapsed)
            elapsed = time.perf_counter() - self._step_end
            self._runtime.timeline.complete("slowdown", "compute", start,
                                            time.perf_counter() - start)
        self._runtime.timeline.complete("compute", "compute", self._step_end, elapsed)

    def _communication_in_compute(self) -> float:
        """Seconds of the compute phase spent waiting for communication (e.g. gradient
        buckets waited for at the end of backward); not compute, so not slowed down."""
        return 0.0

    def _end_step(self) -> None:
        self._steps += 1
        self.metrics.add_step()
        self._step_end = time.perf_counter()
        self._compute_open = True

    def extra_state(self) -> dict:
        return {"steps": self._steps}

    def load_extra_state(self, extra: dict) -> None:
        self._steps = int(extra.get("steps", 0))

    def check_extra_state(self, extra: dict) -> None:
        """Raise ValueError if ``extra`` (what ``extra_state`` saved) cannot resume here.
        Asked before anything is loaded, so a refused state changes nothing."""

    def load_state_dict(self, state_dict):
        """Load a ``state_dict()``; ValueError, with nothing loaded, if its ``"ripples"``
        entry was saved under settings this optimizer cannot resume from."""
        self.check_extra_state(state_dict.get(self.EXTRA_KEY) or {})
        super().load_state_dict(state_dict)
