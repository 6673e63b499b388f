"""The parameter-server benchmark (``benchmarks/ps.py``), one module a mode: ``policies``
(the default: eager against coupled, ASP/SSP/eager against BSP with one slow worker),
``scenarios`` (``--scenarios``: every policy on heterogeneous workers, to a target accuracy;
its bars and plot in ``scenario_report``), ``transport`` (``--transport``: pickled messages
against the buffer transport) and ``psld`` (``--psld``: static placements against PSLD with
one slow server). ``options`` holds the command line and how many ranks each mode runs on."""
