"""What every benchmark shares, one concern a module:

- ``launch``: starting MPI jobs (``mpiexec`` beside this Python, Open MPI's root variables,
  oversubscription, one torch thread per rank) and reading a job's result back;
- ``timing``: interleaved timing of several calls, so that a shared machine's noise hits
  every row alike;
- ``stats``: medians, ratios against a reference row, the slowest rank of an iteration;
- ``report``: the command, date and machine stamped into every result, and writing it.

Benchmarks import it as ``harness`` (run as scripts, ``benchmarks/`` is on ``sys.path``).
"""
