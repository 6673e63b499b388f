import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Test processes are MPI singletons that often import ripples' internals (and so mpi4py)
# before ripples.torch: start MPI here as ripples.torch does, so that their segment files
# go to a directory removed at exit instead of staying in /dev/shm.
from ripples.core.singleton_shm import start_mpi  # noqa: E402

start_mpi()
