"""One validated configuration: explicit arguments > ``RIPPLES_*`` environment > the
Horovod variables a Horovod job may already set (``HOROVOD_NAMES``) > defaults.

This module is the only place that reads ``RIPPLES_*`` variables. An unknown ``RIPPLES_*``
name produces a warning naming the closest valid one (a typo must not silently fall back to
a default); in a job launched by ``mpiexec``/``ripplesrun`` only world rank 0 prints it.
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import warnings
from typing import Any, Mapping, Optional

ENV_PREFIX = "RIPPLES_"
# Variables read by the test suite, not by the library.
_NON_CONFIG_NAMES = {"RIPPLES_TEST_GPU", "RIPPLES_TEST_MPIEXEC", "RIPPLES_LONG_TESTS",
                     "RIPPLES_FUZZ_CASES", "RIPPLES_STRESS_ROUNDS", "RIPPLES_LONG_LIVENESS",
                     "RIPPLES_FAILURE_CASES", "RIPPLES_TEST_NATIVE_LANE"}
# Horovod's variables with the same meaning, so `HOROVOD_TIMELINE=t.json mpiexec ...` keeps
# working after a script switches to ripples.
HOROVOD_NAMES = {
    "HOROVOD_TIMELINE": "timeline",
    "HOROVOD_FUSION_THRESHOLD": "fusion_threshold_bytes",
    "HOROVOD_CYCLE_TIME": "cycle_time_ms",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "stall_warning_s",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "stall_shutdown_s",
}

GROUP_ALLREDUCE = ("auto", "communicator", "ring")
GPU_PATHS = ("auto", "nccl", "mpi", "host")
# group_allreduce="auto": the smallest fused run sent around the ring, within one host and
# across hosts.
RING_MIN_BYTES = 16 << 20
RING_MIN_BYTES_ACROSS_HOSTS = 256 << 10
LOG_LEVELS = ("debug", "info", "warning", "error")
# The world rank as launchers announce it to each process (Open MPI, PMIx, MPICH/Slurm's PMI),
# readable before MPI is initialized.
LAUNCHER_RANK_NAMES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


@dataclasses.dataclass(frozen=True)
class Config:
    """Runtime settings. Every field can be set as ``RIPPLES_<FIELD>`` in the environment.

    timeout_s: every blocking wait of a collective gives up after this many seconds and
        raises ``RipplesTimeoutError`` naming the operation and the missing ranks.
    stall_warning_s: a wait that lasts longer than this logs one warning first.
    wait_for_busy_peers: a wait that reaches ``timeout_s`` asks the peers it waits for how
        they are, and goes on (with stall warnings) while they are alive and busy outside
        ripples, or waiting on a busy peer; it fails only on a dead peer or on peers waiting
        on each other (``ripples.comm.liveness``). False: fail at ``timeout_s`` regardless.
    stall_shutdown_s: a peer outside ripples whose main thread has not moved (the same
        Python stack, e.g. blocked in a barrier ripples' peers never reach) for this long is
        stuck, not slow: the wait on it fails, naming the rank and where it is. A peer whose
        stack moves (a computing loop) is never failed. 0: busy peers are waited for
        however long they stay still.
    abort_on_exception: an exception that escapes the script on one rank ends the whole job
        at once (its traceback printed, then ``MPI_Abort``), so the other ranks do not
        wait for it; under ``fault_tolerant`` the rank leaves as a dead rank and the
        survivors go on. False: the rank exits normally and the others wait for it until
        their ``timeout_s`` (the behaviour of a plain mpi4py script).
    native_lane: a repeated all-reduce or P-Reduce of one host float tensor (same group,
        shape, dtype and op as before) runs as one call into native code
        (``ripples.ops.native_lane``), which checks that every member makes the same call
        and falls back to the Python path otherwise. False: always the Python path. Every
        rank must use the same setting.
    gpu_path: how CUDA tensors are all-reduced (every rank must choose alike).
        ``"nccl"``: NCCL through cupy, one GPU per rank of a group. ``"mpi"``: MPI reads
        device memory directly (a CUDA-aware MPI only). ``"host"``: copied to host memory,
        reduced there over MPI, copied back (any MPI; ranks may share a GPU). ``"auto"``:
        NCCL when cupy with NCCL imports, else ``"host"``.
    fault_tolerant: survive dead ranks (decentralized and elastic modes): a process
        failure revokes ripples' communicators, the survivors shrink the world and go on
        (``ripples.comm.failures``, ``ripples.torch.elastic``). Needs Open MPI's ULFM
        (``mpiexec --with-ft ulfm``; ``ripplesrun --fault-tolerant`` sets both).
    group_allreduce: how a group that is not the whole world (a P-Reduce) all-reduces host
        tensors. ``"communicator"``: an MPI communicator per group, made on first use and
        cached (``cache_capacity``). ``"ring"``: a ring of point-to-point messages over one
        long-lived communicator, nothing made per group (``ripples.ops.ring_allreduce``).
        ``"auto"``: the ring under ``fault_tolerant`` (a group communicator being made
        cannot be revoked, so a death then could hang the survivors), else by size: the
        ring for runs of at least ``RING_MIN_BYTES_ACROSS_HOSTS`` (256 KiB) when the
        members sit on more than one host, of at least ``RING_MIN_BYTES`` (16 MiB) within
        one host, a communicator below. The whole world's host all-reduces (gradient
        buckets included) take the ring by the same sizes unless this is
        ``"communicator"``. Why: across hosts over TCP (1 Gbit/s, 8 ranks on 4 hosts)
        Open MPI's all-reduce took 1.5-2.7x a ring's time from 192 KB on (736 ms against 331
        ms for 20 MB), and was faster at 128 KB and below; within one host it is as fast
        or faster up to about 16 MiB. Every rank must use the same setting (``init()``
        checks).
    horovod_join: ``join()`` exactly as Horovod's. Once a rank has joined, an all-gather
        or broadcast on the other ranks raises ``MismatchError`` (a ``RuntimeError``)
        instead of running without it, and an Average all-reduce (gradient buckets
        included) divides by every member of its process set, the joined ones counting as
        zeros, instead of by the members still active. Every rank must use the same setting.
    cache_capacity: group communicators kept per rank (least recently used is freed).
    fusion_threshold_bytes: consecutive agreed all-reduces are fused into buffers up to
        this size.
    bucket_bytes: ``DistributedOptimizer`` (``sync="allreduce"``) lays float32/float64 host
        gradients out in flat buckets of up to this size, all-reduced in reverse layer
        order while backward runs; 0 all-reduces each gradient by name at ``step()``.
    cycle_time_ms: how long the background engine lets asynchronous collectives gather
        before it negotiates them (Horovod's cycle time); a caller that waits negotiates at
        once.
    verbose: log the MPI library and per-rank facts at ``init()``.
    log_level: threshold of the ``"ripples"`` logger, set at ``init()``: ``"debug"``,
        ``"info"``, ``"warning"`` or ``"error"`` (any case). Below ``"warning"``, ripples
        adds a handler printing to stderr unless logging is already configured.
    slowdown: heterogeneity injection, ``"RANK:FACTOR[,RANK:FACTOR]"``.
    random_slowdown: ``"P:FACTOR"``: each step each rank is slow with probability P.
    compute_ms: emulated compute time per step (benchmarks), 0 for real compute only.
    timeline: path of the job's Chrome-trace JSON (one file, written by rank 0 at shutdown),
        empty for none.
    timeline_per_rank: each rank writes its own trace file instead (``trace.json`` ->
        ``trace.rank0.json``, ...), with no communication at shutdown.
    metrics_path: path prefix for per-rank metrics JSON written at shutdown, empty for none.
    ps_servers: number of ranks that become parameter servers in ``init()``.
    ps_spare: idle spare server ranks besides those (``ripplesrun --ps-spare``), which PSLD
        can scale out onto.
    server_slowdown: slowness injection for servers, ``"INDEX:FACTOR[,INDEX:FACTOR]"``
        (``ripples.ps.slowness``).
    server_cost: the servers' emulated cost per message, ``"FIXED_MS:NS_PER_BYTE"`` (default
        ``"0.2:1"`` once ``server_slowdown`` or this is set).
    seed: seed shared by all ranks for random schedules and injected slowdowns.
    elastic_dir: ``hvd.elastic`` keeps its last commit here (rank 0 writes it) and asks the
        launcher for a restart here (``ripplesrun --min-np/--max-np`` sets it); empty for
        none.
    min_np, max_np: with ``elastic_dir``: a world shrunk below ``min_np`` stops for a
        restart at once; one below ``max_np`` stops for a restart at its next ``commit()``,
        and the launcher starts it again on ``max_np`` ranks from that commit. 0: no bound.
    """

    timeout_s: float = 60.0
    stall_warning_s: float = 10.0
    wait_for_busy_peers: bool = True
    stall_shutdown_s: float = 300.0
    abort_on_exception: bool = True
    native_lane: bool = True
    gpu_path: str = "auto"
    fault_tolerant: bool = False
    group_allreduce: str = "auto"
    horovod_join: bool = False
    cache_capacity: int = 64
    fusion_threshold_bytes: int = 64 * 1024 * 1024
    bucket_bytes: int = 25 * 1024 * 1024
    cycle_time_ms: float = 1.0
    verbose: bool = False
    log_level: str = "warning"
    slowdown: str = ""
    random_slowdown: str = ""
    compute_ms: float = 0.0
    timeline: str = ""
    timeline_per_rank: bool = False
    metrics_path: str = ""
    ps_servers: int = 0
    ps_spare: int = 0
    server_slowdown: str = ""
    server_cost: str = ""
    seed: int = 0
    elastic_dir: str = ""
    min_np: int = 0
    max_np: int = 0

    def __post_init__(self):
        _require(self.timeout_s > 0, "timeout_s", self.timeout_s, "a positive number of seconds")
        _require(self.stall_warning_s > 0, "stall_warning_s", self.stall_warning_s,
                 "a positive number of seconds")
        _require(self.stall_shutdown_s >= 0, "stall_shutdown_s", self.stall_shutdown_s,
                 "a number of seconds >= 0 (0 never fails a busy peer)")
        _require(self.gpu_path in GPU_PATHS, "gpu_path", self.gpu_path,
                 " or ".join(repr(v) for v in GPU_PATHS))
        _require(self.group_allreduce in GROUP_ALLREDUCE, "group_allreduce",
                 self.group_allreduce, " or ".join(repr(v) for v in GROUP_ALLREDUCE))
        _require(isinstance(self.log_level, str) and self.log_level.lower() in LOG_LEVELS,
                 "log_level", self.log_level, " or ".join(repr(v) for v in LOG_LEVELS))
        # Frozen: normalize the case through object.__setattr__ ("DEBUG" -> "debug").
        object.__setattr__(self, "log_level", self.log_level.lower())
        _require(self.cache_capacity >= 1, "cache_capacity", self.cache_capacity, "an integer >= 1")
        _require(self.fusion_threshold_bytes >= 0, "fusion_threshold_bytes",
                 self.fusion_threshold_bytes, "an integer >= 0 (0 disables fusion)")
        _require(self.bucket_bytes >= 0, "bucket_bytes", self.bucket_bytes,
                 "an integer >= 0 (0 disables gradient buckets)")
        _require(self.cycle_time_ms >= 0, "cycle_time_ms", self.cycle_time_ms, "a number >= 0")
        _require(self.compute_ms >= 0, "compute_ms", self.compute_ms, "a number >= 0")
        _require(self.ps_servers >= 0, "ps_servers", self.ps_servers, "an integer >= 0")
        _require(self.ps_spare >= 0, "ps_spare", self.ps_spare, "an integer >= 0")
        _require(self.min_np >= 0, "min_np", self.min_np, "an integer >= 0")
        _require(self.max_np == 0 or self.max_np >= max(self.min_np, 1), "max_np",
                 self.max_np, f"0 or an integer >= min_np ({self.min_np})")

    @property
    def group_transport(self) -> str:
        """How groups all-reduce, ``group_allreduce`` resolved: ``"ring"``,
        ``"communicator"``, or ``"by size"`` (the ring from ``RING_MIN_BYTES`` on, from
        ``RING_MIN_BYTES_ACROSS_HOSTS`` across hosts)."""
        if self.group_allreduce == "auto":
            return "ring" if self.fault_tolerant else "by size"
        return self.group_allreduce

    def ring_carries(self, nbytes: int, across_hosts: bool = False, world: bool = False) -> bool:
        """Whether a host all-reduce of ``nbytes`` (one fused run) goes around the ring
        rather than over MPI's all-reduce: a group's (``world`` False) by
        ``group_transport``; the whole world's by size unless ``"communicator"``.
        ``across_hosts``: the members sit on more than one host."""
        transport = self.group_transport
        if transport == "communicator":
            return False
        if transport == "ring" and not world:
            return True
        return nbytes >= (RING_MIN_BYTES_ACROSS_HOSTS if across_hosts else RING_MIN_BYTES)

    def apply_log_level(self) -> None:
        """Set the ``"ripples"`` logger to ``log_level`` (``init()`` calls this).

        Messages below WARNING reach no handler by default, so for ``"debug"`` and
        ``"info"`` a stderr handler is added when neither the ``"ripples"`` logger nor the
        root logger has one (a script that configured logging keeps its own handlers).
        """
        logger = logging.getLogger("ripples")
        level = getattr(logging, self.log_level.upper())
        logger.setLevel(level)
        if level < logging.WARNING and not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("ripples %(levelname)s: %(message)s"))
            logger.addHandler(handler)

    @classmethod
    def load(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> "Config":
        """Build the configuration from ``overrides`` (highest), the environment, defaults."""
        environ = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in overrides:
            if name not in fields:
                raise TypeError(f"Config has no setting {name!r}; valid settings: {sorted(fields)}")
        values = {name: _parse(key, environ[key], fields[name].type)
                  for key, name in HOROVOD_NAMES.items() if environ.get(key, "") != ""}
        for key, text in environ.items():
            if not key.startswith(ENV_PREFIX) or key in _NON_CONFIG_NAMES:
                continue
            name = key[len(ENV_PREFIX):].lower()
            if name not in fields:
                if launcher_rank(environ) in (None, 0):
                    # stacklevel=1: one location, so Python prints each message once per
                    # process however many times the configuration is loaded.
                    warnings.warn(unknown_variable_message(key, fields), stacklevel=1)
                continue
            values[name] = _parse(key, text, fields[name].type)
        values.update(overrides)
        return cls(**values)


def launcher_rank(environ: Mapping[str, str]) -> Optional[int]:
    """This process's world rank as set by the launcher (``LAUNCHER_RANK_NAMES``), or None
    for a process that no launcher started (or an unreadable value)."""
    for key in LAUNCHER_RANK_NAMES:
        text = environ.get(key, "").strip()
        if text:
            try:
                return int(text)
            except ValueError:
                return None
    return None


def unknown_variable_message(key: str, settings) -> str:
    """The warning for an unknown ``RIPPLES_*`` variable ``key``: the closest valid name
    (``difflib``) when one is close, else all of them. ``settings``: the valid field names."""
    suffix = key[len(ENV_PREFIX):].lower()
    close = difflib.get_close_matches(suffix, list(settings), n=1, cutoff=0.7)
    if close:
        return (f"unknown environment variable {key} ignored; did you mean "
                f"{ENV_PREFIX + close[0].upper()}?")
    return (f"unknown environment variable {key} ignored; ripples reads "
            f"{', '.join(ENV_PREFIX + name.upper() for name in sorted(settings))}")


def _parse(key: str, text: str, type_name: Any):
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    try:
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"environment variable {key}={text!r} is not a valid {kind}") from None


def _require(ok: bool, name: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"Config.{name} must be {expected}, got {value!r}")
