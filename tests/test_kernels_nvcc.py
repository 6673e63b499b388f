"""Every .cu file compiles with nvcc as a full translation unit (with the host entry points)
and, for sm_80 and sm_90, as the kernel-only code NVRTC sees."""
import shutil
import subprocess

import pytest

from ripples.kernels.sources import KERNEL_FILES, source_dir

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_compiles(tmp_path, name):
    src = source_dir() / name
    # The host entry points do not depend on the architecture: one full compile checks them.
    full = subprocess.run([NVCC, "-arch=sm_80", "-c", str(src), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    for arch in ("sm_80", "sm_90"):
        kernels_only = subprocess.run([NVCC, f"-arch={arch}", "--ptx", "-DRIPPLES_KERNELS_ONLY",
                                       str(src), "-o", str(tmp_path / "k.ptx")],
                                      capture_output=True, text=True, timeout=300)
        assert kernels_only.returncode == 0, f"{arch}: {kernels_only.stderr}"
        ptx = (tmp_path / "k.ptx").read_text()
        # The aligned middle of every copy must use 128-bit accesses.
        assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx, arch
        assert ".entry ripples_" in ptx, arch
