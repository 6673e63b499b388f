"""A discrete-event simulator of ripples' schedules at scale (``ripples sim``).

It runs the real schedule code (:mod:`ripples.schedule`) with the simulator's clock,
real SGD on a logistic regression per worker (:mod:`.stats`), an alpha-beta network
(:mod:`.network`) and speed models (:mod:`.workers`). Build a :class:`Scenario`, call
:func:`simulate`, or use :func:`sweep` and :mod:`.report` for tables and plots.
"""
from .engine import DeadlockError, RunResult, simulate
from .network import Link, Network
from .runner import run_modes, sweep, target_loss
from .scenario import MODES, Scenario
from .stats import Problem
from .workers import Compute, Speed

__all__ = ["Scenario", "simulate", "sweep", "run_modes", "target_loss", "RunResult",
           "DeadlockError", "Network", "Link", "Compute", "Speed", "Problem", "MODES"]
