"""Pages generated at build time, so that they cannot drift from the code and the results.

mkdocs runs this file as a hook (``hooks:`` in ``mkdocs.yml``). A page asks for generated
content with a marker on a line of its own:

- ``<!-- generated: config -->``: every ``ripples.core.config.Config`` field, its
  ``RIPPLES_*`` variable, type, default and the description from Config's docstring;
- ``<!-- generated: bench FILE.json -->``: the table of ``benchmarks/results/FILE.json`` with
  its command, date and machine;
- ``<!-- generated: runs METRIC FILE.json FILE.json ... -->``: repeated ``train.py`` runs side
  by side: per scenario and mode, ``METRIC`` of every run and, in parentheses, the median
  over the runs of the ratio to all-reduce in the same run (each file keeps its own
  ``bench`` marker for the details);
- ``<!-- generated: bench-rest -->``: every result file that no marker of the page named;
- ``<!-- generated: ripplesrun-help -->``: ``ripplesrun --help``, as the installed code prints it;
- ``<!-- generated: ps-api -->``: mkdocstrings directives for every name in ``ripples.ps.__all__``,
  found where the package's lazy imports (``_HOMES``) say it lives, so the page follows
  the package when its modules move.

The functions below are plain (no mkdocs import), so tests call them directly.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"^<!-- generated: (config|bench-rest|ripplesrun-help|ps-api|bench (\S+\.json)"
                    r"|runs (\w+)((?: \S+\.json)+)) -->$", re.M)

# Commands for result files that do not record their own (taken from where each was
# documented when it was measured). A file that records "command" uses its own.
COMMANDS = {
    "epochs_np4.json": "python benchmarks/epochs.py --np 4 --repeats 3 "
                       "--json benchmarks/results/epochs_np4.json",
    "train_np8.json": "python benchmarks/train.py --np 8 --seconds 15 "
                      "--json benchmarks/results/train_np8.json",
    "train_np8_doorbell.json": "python benchmarks/train.py --np 8 --seconds 15 --modes "
                               "allreduce,ripples/generator,adpsgd "
                               "--json benchmarks/results/train_np8_doorbell.json",
    "train_np8_groups_communicator.json": "RIPPLES_GROUP_ALLREDUCE=communicator python "
                                          "benchmarks/train.py --np 8 --scenarios one-slow "
                                          "--modes allreduce,random,generator ...",
    "train_np8_groups_ring.json": "RIPPLES_GROUP_ALLREDUCE=ring python benchmarks/train.py "
                                  "--np 8 --scenarios one-slow --modes "
                                  "allreduce,random,generator ...",
    "step_np2.json": "python benchmarks/step.py --np 2 --steps 200 --repeats 3",
    "step_np4.json": "python benchmarks/step.py --np 4 --steps 100 --repeats 2",
    "collectives_np2.json": "mpiexec -n 2 --bind-to none python benchmarks/collectives.py "
                            "-b 8 -e 16M -f 4 -g 2 -w 5 -n 20 --rounds 9 --memory "
                            "--json benchmarks/results/collectives_np2.json",
    "collectives_np4.json": "mpiexec -n 4 --oversubscribe --bind-to none python "
                            "benchmarks/collectives.py -b 8 -e 16M -f 4 -g 2 -w 5 -n 20 "
                            "--rounds 9 --split --miss-samples 9 "
                            "--json benchmarks/results/collectives_np4.json",
    "latency_after_idle_np8.json": "mpiexec -n 8 --oversubscribe python "
                                   "benchmarks/latency_after_idle.py --iterations 150 "
                                   "--json benchmarks/results/latency_after_idle_np8.json",
}
for _name, _net in (("communicator_sm", ""), ("ring_sm", ""),
                    ("communicator_tcp", "--mca btl tcp,self "),
                    ("ring_tcp", "--mca btl tcp,self ")):
    COMMANDS[f"groups_np4_{_name}.json"] = (
        f"RIPPLES_GROUP_ALLREDUCE={_name.split('_')[0]} mpiexec -n 4 --oversubscribe "
        f"--bind-to none {_net}python benchmarks/collectives.py -b 8 -e 32M -f 4 -g 2 -w 5 "
        f"-n 20 --rounds 9 --split --miss-samples 9 -o allreduce,partial_allreduce "
        f"--json benchmarks/results/groups_np4_{_name}.json")

# Columns worth showing for row lists whose rows carry many fields; others show every
# scalar field.
COLUMNS = {
    "collectives": ["op", "size", "group", "groups", "time_us", "ref_us", "ratio", "added_us",
                    "wrong"],
    "groups": ["op", "size", "group", "groups", "time_us", "ref_us", "ratio", "added_us",
               "wrong"],
    "train": ["steps_per_s", "samples_per_s", "steps_min", "steps_max", "time_to_target_s",
              "averaged_accuracy", "worst_accuracy", "wait_share"],
    "epochs": ["wall_s_median", "time_vs_allreduce", "accuracy_median",
               "accuracy_vs_allreduce"],
    "sim": ["workers", "mode", "steps_per_s", "fraction_of_ceiling", "time_to_target_s",
            "throughput_x_allreduce", "time_to_target_x_allreduce", "consensus_distance"],
    "ps_heterogeneous": ["scenario", "row", "time_to_target_s", "throughput_samples_per_s",
                         "push_bytes_per_sample", "final_accuracy"],
    "ps_casp": ["scenario", "row", "time_to_target_s", "throughput_samples_per_s",
                "push_bytes_per_sample", "final_accuracy"],
    "ps_epsp": ["scenario", "row", "time_to_target_s", "throughput_samples_per_s",
                "push_bytes_per_sample", "final_accuracy"],
    "host_faults": ["case", "mode", "exit_status", "last_epoch", "stall_s",
                    "lost_host_ranks_gone_after_s", "job_ended_after_s", "final_accuracy",
                    "recovered_losing_nobody", "names_the_rank"],
    "ps_psld": ["row", "iter_ms_median", "load_max_over_mean", "migrations", "rollbacks"],
    # a repeated sweep's medians (its "rows"), else one run per row (its "table")
    "ps_sweep": ["ratio", "slow_workers", "row", "runs", "final_count", "steps_per_s",
                 "final_accuracy", "last_second_accuracy", "time_to_target_s",
                 "times_to_target_s", "vs_best_fixed", "push_bytes_per_sample",
                 "stale_push_share", "communities"],
}


# ----------------------------------------------------------------------------- configuration

def config_descriptions(doc: str, names: Iterable[str]) -> Dict[str, str]:
    """Each field's description from a docstring written as ``name: text`` paragraphs
    (continuation lines indented; ``a, b: text`` describes both)."""
    names = set(names)
    found: Dict[str, str] = {}
    current: List[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        match = re.match(r"^(\w+(?:, \w+)*): (.*)$", line)
        if match and all(n in names for n in match.group(1).split(", ")):
            current = match.group(1).split(", ")
            for name in current:
                found[name] = match.group(2)
        elif current and line.startswith(" ") and line.strip():
            for name in current:
                found[name] += " " + line.strip()
        else:
            current = []
    return found


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")


def config_table() -> str:
    """The configuration table, one row per ``Config`` field, in declaration order."""
    from ripples.core.config import ENV_PREFIX, HOROVOD_NAMES, Config
    fields = dataclasses.fields(Config)
    descriptions = config_descriptions(Config.__doc__ or "", [f.name for f in fields])
    horovod = {field: name for name, field in HOROVOD_NAMES.items()}
    lines = ["| variable | `Config` field | type | default | meaning |",
             "|---|---|---|---|---|"]
    for field in fields:
        kind = field.type if isinstance(field.type, str) else field.type.__name__
        default = "" if field.default is dataclasses.MISSING else repr(field.default)
        meaning = _rst_to_md(descriptions.get(field.name, "(not described in Config's "
                                                          "docstring)"))
        if field.name in horovod:
            meaning += f" Also read from Horovod's `{horovod[field.name]}`."
        variable = ENV_PREFIX + field.name.upper()
        lines.append(f"| `{variable}` | `{field.name}` | {kind} | `{default}` | "
                     f"{meaning.replace('|', '&#124;')} |")
    return "\n".join(lines)


def ripplesrun_help() -> str:
    """``ripplesrun --help`` in a code block (run in a subprocess: the launcher imports MPI)."""
    result = subprocess.run(
        [sys.executable, "-c", "from ripples.runner.launch import main; main(['--help'])"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "COLUMNS": "100"})
    if result.returncode != 0:
        raise RuntimeError(f"ripplesrun --help failed ({result.returncode}): {result.stderr}")
    return "```text\n" + result.stdout.rstrip() + "\n```"


def ps_api() -> str:
    """One ``:::`` directive per public name of ``ripples.ps`` (lazily imported there, so
    static analysis cannot follow the package's own names)."""
    import ripples.ps as ps
    blocks = []
    for name in ps.__all__:
        home = ps._HOMES[name]
        module = "ripples.ps" + home if home.startswith(".") else home
        blocks.append(f"::: {module}.{name}")
    return "\n\n".join(blocks)


# ----------------------------------------------------------------------------- benchmarks

def _family(name: str) -> str:
    for prefix in ("epochs", "train", "step", "collectives", "groups", "latency_after_idle",
                   "sim_hosts", "sim", "ps_heterogeneous", "ps_casp", "ps_epsp", "ps_psld", "host_faults"):
        if name.startswith(prefix):
            return prefix
    return name[:-len(".json")]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value).replace("|", "&#124;")


def _table(rows: List[dict], columns: Optional[List[str]] = None) -> str:
    if not rows:
        return "(no rows)"
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k, v in row.items()
                        if k not in columns and not isinstance(v, (list, dict))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _flatten(prefix: str, value) -> dict:
    """Nested dicts of scalars as ``a.b`` keys (lists are left out: curves, samples)."""
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            out.update(_flatten(f"{prefix}.{key}" if prefix else str(key), inner))
        return out
    if isinstance(value, list):
        return {}
    return {prefix: value}


def _rows(name: str, data) -> List[dict]:
    """The result file's measurements as table rows, whatever its layout."""
    family = _family(name)
    if isinstance(data.get("scenarios"), dict):  # train.py, epochs.py
        rows = []
        for scenario, found in data["scenarios"].items():
            ceilings = {k: v for k, v in found.items() if k != "modes"}
            label = scenario + "".join(f" ({k} {_cell(v)})" for k, v in ceilings.items())
            modes = found.get("modes", [])
            items = modes.items() if isinstance(modes, dict) else [(m["mode"], m) for m in modes]
            for mode, values in items:
                rows.append({"scenario": label, "mode": mode,
                             **{k: v for k, v in values.items() if k != "mode"}})
        return rows
    for key, label, unit in (("steps_per_s", "job", "steps/s"),
                             ("median_us", "operation", "median us")):
        if isinstance(data.get(key), dict):
            return [{label: k, unit: v} for k, v in data[key].items()]
    if family == "casp_controller":
        return [{"mix": mix, **{k: v for k, v in m.items() if not isinstance(v, list)}}
                for mix, m in data["mixes"].items()]
    for key in ("rows", "table"):
        found = data.get(key)
        if isinstance(found, list):
            return [_flatten("", row) if any(isinstance(v, dict) for v in row.values())
                    else row for row in found]
        if isinstance(found, dict):
            return [{"row": k, **_flatten("", v)} for k, v in found.items()]
    # Anything else: its scalar facts, one row per top-level dict, or one row of the
    # top-level scalars where it has none.
    parts = [{"part": k, **_flatten("", v)} for k, v in data.items() if isinstance(v, dict)
             and k not in ("args", "settings", "header", "assumptions")]
    return parts or [{k: v for k, v in data.items() if not isinstance(v, (list, dict))
                      and k not in ("command", "date", "machine", "cores", "cluster")}]


def _columns(name: str, rows: List[dict]) -> Optional[List[str]]:
    family = _family(name)
    wanted = COLUMNS.get(family)
    if wanted is None:
        return None
    if family in ("train", "epochs"):
        wanted = ["scenario", "mode"] + wanted
    present = [c for c in wanted if any(c in row for row in rows)]
    return present or None


def _machine(data: dict) -> str:
    header = data.get("header") if isinstance(data.get("header"), dict) else {}
    machine = data.get("machine") or header.get("machine") or "not recorded"
    cores = data.get("cores") or header.get("cores")
    return f"{machine}, {cores} cores" if cores else str(machine)


def bench_section(name: str) -> str:
    """One result file: its command, date, machine and compute, then its table."""
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"benchmarks/results/{name} does not exist (named by a "
                                f"'generated: bench' marker in the docs)")
    data = json.loads(path.read_text())
    header = data.get("header") if isinstance(data.get("header"), dict) else {}
    command = data.get("command") or COMMANDS.get(name) or "not recorded in the file"
    date = data.get("date") or header.get("date") or "not recorded"
    facts = [f"**`benchmarks/results/{name}`**", "",
             f"- command: `{command}`", f"- date: {date}", f"- machine: {_machine(data)}"]
    for key in ("compute", "setup", "device", "path"):
        if data.get(key):
            facts.append(f"- {key}: {_cell(data[key])}")
    rows = _rows(name, data)
    parts = ["\n".join(facts), _table(rows, _columns(name, rows))]
    bars = data.get("bars")
    if isinstance(bars, list) and bars:
        items = [b if isinstance(b, str) else
                 f"{b.get('bar')}: {_cell(b.get('value'))} (target {b.get('target')}, "
                 f"{b.get('status')})" for b in bars]
        parts.append("Bars recorded in the file:\n\n" + "\n".join(f"- {i}" for i in items))
    elif isinstance(bars, dict) and bars:
        parts.append("Bars recorded in the file:\n\n" + "\n".join(
            f"- {k}: {_cell(v)}" for k, v in _flatten("", bars).items()))
    return "\n\n".join(parts)


def runs_table(metric: str, names: List[str]) -> str:
    """Repeated ``train.py`` runs (``names``, one result file each) side by side: a row per
    scenario, a column per mode, each cell ``metric`` of every run ("not reached" where it
    is None) and the median over runs of the ratio to all-reduce in the same run."""
    runs = []
    for name in names:
        path = RESULTS / name
        if not path.is_file():
            raise FileNotFoundError(f"benchmarks/results/{name} does not exist (named by a "
                                    f"'generated: runs' marker in the docs)")
        runs.append(json.loads(path.read_text())["scenarios"])
    scenarios = list(dict.fromkeys(s for run in runs for s in run))
    modes = list(dict.fromkeys(m["mode"] for run in runs for found in run.values()
                               for m in found["modes"]))
    lines = ["| scenario | " + " | ".join(modes) + " |", "|" + "---|" * (len(modes) + 1)]
    for scenario in scenarios:
        by_run = [{m["mode"]: m.get(metric) for m in run[scenario]["modes"]}
                  for run in runs if scenario in run]
        cells = []
        for mode in modes:
            found = [values[mode] for values in by_run if mode in values]
            text = " / ".join("not reached" if v is None else f"{v:.1f}" if abs(v) >= 1
                              else f"{v:.3g}" for v in found) or "-"
            ratios = [values[mode] / values["allreduce"] for values in by_run
                      if values.get(mode) is not None and values.get("allreduce")]
            if mode != "allreduce" and ratios and len(ratios) == len(found):
                text += f" ({statistics.median(ratios):.2f}x)"
            cells.append(text)
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    files = ", ".join(f"`{n}`" for n in names)
    return (f"`{metric}` of each run ({files}); in parentheses the median over the runs of "
            f"the ratio to all-reduce in the same run:\n\n" + "\n".join(lines))


def result_files() -> List[str]:
    return sorted(p.name for p in RESULTS.glob("*.json"))


def expand(markdown: str) -> str:
    """Replace every marker in ``markdown`` with its generated content."""
    named = {m.group(2) for m in MARKER.finditer(markdown) if m.group(2)}

    def replace(match) -> str:
        if match.group(1) == "config":
            return config_table()
        if match.group(1) == "ps-api":
            return ps_api()
        if match.group(1) == "ripplesrun-help":
            return ripplesrun_help()
        if match.group(3):
            return runs_table(match.group(3), match.group(4).split())
        if match.group(1) == "bench-rest":
            rest = [n for n in result_files() if n not in named]
            return "\n\n".join(f"### {n}\n\n{bench_section(n)}" for n in rest)
        return bench_section(match.group(2))

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown, page=None, config=None, files=None, **kwargs):
    """mkdocs hook: expand the markers of every page."""
    return expand(markdown)
