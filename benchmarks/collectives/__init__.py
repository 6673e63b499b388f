"""The collectives benchmark (``benchmarks/collectives.py``), one concern a module:
``options`` (the nccl-tests command line), ``context`` (the ranks' communicators),
``plugins`` (one per collective: ripples and raw MPI on the same buffers), ``sweep`` (the
alternating timed rounds of a plug-in at one size), ``cache_miss`` (the first call on a new
group), ``memory`` (transparent huge pages against memcpy) and ``report`` (table, bars,
header)."""
