"""The collectives benchmark runs under mpiexec, writes well-formed JSON and finds no wrong
results. Behaviour only: nothing here depends on how fast the machine is."""
import json
import sys

from mpi_launch import REPO_DIR, run_mpi

SCRIPT = str(REPO_DIR / "benchmarks" / "collectives.py")
OPS = ("allreduce", "partial_allreduce", "allgather", "broadcast")
TINY = ["-b", "8", "-e", "4K", "-f", "4", "-n", "3", "-w", "1", "-c", "1", "--rounds", "2"]


def run_bench(tmp_path, nprocs, *extra):
    out = tmp_path / "collectives.json"
    proc = run_mpi([sys.executable, SCRIPT, *TINY, "--json", str(out), *extra], nprocs,
                   timeout=120)
    return json.loads(out.read_text()), proc.stdout


def check_rows(data, world, group, groups):
    sizes = [8, 32, 128, 512, 2048]
    assert data["settings"]["sizes"] == sizes
    for op in OPS:
        rows = [r for r in data["rows"] if r["op"] == op]
        assert len(rows) == len(sizes), op
        for row in rows:
            assert row["wrong"] == 0 and row["ref_wrong"] == 0, row
            assert row["time_us"] > 0 and row["ref_us"] > 0
            assert abs(row["ratio"] - row["ref_us"] / row["time_us"]) < 1e-9 * row["ratio"]
            assert len(row["rounds_us"]) == len(row["ref_rounds_us"]) == 2
            if op == "partial_allreduce":
                assert (row["group"], row["groups"]) == (group, groups)
            else:
                assert (row["group"], row["groups"]) == (world, 1)
            # allgather rounds the size to a whole number of floats per rank
            per = row["count"] // row["group"] if op == "allgather" else row["count"]
            assert row["size"] == 4 * row["count"] and per >= 1


def test_two_ranks_json_and_correctness(tmp_path):
    data, stdout = run_bench(tmp_path, 2, "--memory")
    header = data["header"]
    assert header["world_size"] == 2 and header["cores"] >= 1
    assert header["compute"].startswith("no compute")
    assert header["mpi_library"] and "\0" not in header["mpi_library"] and header["date"]
    check_rows(data, world=2, group=2, groups=1)
    assert "group is the whole world" in data["cache_miss"]["note"]
    for kind in ("numpy", "torch"):
        assert data["memory"][kind]["memcpy_gbps"] > 0
    assert {b["status"] for b in data["bars"]} <= {"PASS", "MISS", "N/A"}
    assert "size count type redop group time(us) algbw(GB/s) busbw(GB/s) #wrong" in " ".join(
        stdout.split())


def test_four_ranks_split_groups_and_cache_miss(tmp_path):
    data, _ = run_bench(tmp_path, 4, "-g", "2", "--split", "--miss-samples", "2")
    check_rows(data, world=4, group=2, groups=2)
    for row in (r for r in data["rows"] if r["op"] == "partial_allreduce"):
        assert set(row["per_group_us"]) == {"(0, 1)", "(2, 3)"}
        assert row["aggregate_busbw"] == 2 * row["busbw"]
    miss = data["cache_miss"]
    assert (miss["group"], miss["groups"], len(miss["miss_samples_us"])) == (2, 2, 2)
    assert miss["miss_us"] > 0


def test_bad_group_size_fails_with_a_message(tmp_path):
    proc = run_mpi([sys.executable, SCRIPT, *TINY, "-g", "3"], 2, timeout=60, check=False)
    assert proc.returncode != 0
    assert "-g 3" in proc.stdout
