"""The parts of ``benchmarks/generator_service_cpu.py`` that run inside its MPI jobs:
``designs`` (the service loops compared, and the Open MPI settings each needs) and ``job``
(the phases every rank runs, and rank 0's measurements)."""
