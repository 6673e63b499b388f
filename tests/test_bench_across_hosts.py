"""What the across-hosts benchmarks compute without a cluster: the padded model of
``train.py --model-mb``, the ``mpiexec`` line of a job on the emulated cluster, and the
simulator calibration of ``sim_hosts.py`` (its effective bandwidth is the network model's
ring solved backwards). No processes are started."""
import sys

import pytest

from mpi_launch import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "benchmarks"))
import padded  # noqa: E402
import sim_hosts  # noqa: E402
import train  # noqa: E402
from harness import launch  # noqa: E402

from ripples.sim.network import Link, Network  # noqa: E402


def test_padded_model_carries_the_bytes_and_computes_the_same(monkeypatch):
    import torch
    import ripples.demo as demo
    monkeypatch.setattr(demo, "make_model", demo.make_model)  # restored afterwards
    small = demo.make_model(64, 10, 0)
    padded.pad_models(0.004)
    model = demo.make_model(64, 10, 0)
    assert model.pad.numel() == 1000
    x = torch.randn(5, 64)
    assert torch.equal(model(x), small(x))
    model(x).sum().backward()
    assert model.pad.grad is not None and model.pad.grad.abs().sum() == 0


def test_generator_node_is_a_mode():
    assert "ripples/generator-node" in train.selected_modes("generator-node")


def test_a_job_across_hosts_starts_on_h1_without_local_placement(monkeypatch):
    monkeypatch.setenv("NETCLUSTER", __file__)  # any existing file stands for the tool
    command = launch.mpiexec_command(8, ["python", "x.py"], across_hosts=True)
    assert command[:3] == [__file__, "exec", "h1"]
    assert "-n" in command and "8" in command and "--oversubscribe" not in command
    assert "--host" not in command


@pytest.mark.parametrize("members,latency", [(8, 0.0), (4, 90e-6)])
def test_effective_bandwidth_reproduces_the_measured_allreduce(members, latency):
    nbytes, seconds = 20e6, 1.0
    bandwidth = sim_hosts.ring_bandwidth(nbytes, members, seconds, latency)
    network = Network(workers_per_node=1, inter=Link(latency, bandwidth))
    assert network.allreduce_s(nbytes, members, members) == pytest.approx(seconds)


def test_calibrations_differ_only_in_the_inter_host_bandwidth():
    link = {"hosts": ["h1"] * 2 + ["h2"] * 2, "ranks_per_host": 2, "model_mb": 20.0,
            "links": {"inter": {"latency_us": 90.0, "gbps": 0.95},
                      "intra": {"latency_us": 80.0, "gbps": 27.0}},
            "allreduce_s": {"all ranks": 1.0}}
    flags = sim_hosts.calibrations(link)
    ping, allreduce = (dict(zip(f[::2], f[1::2])) for f in (flags["pingpong"],
                                                             flags["allreduce"]))
    assert ping["--inter-gbps"] == "0.9500"
    assert float(allreduce["--inter-gbps"]) < 0.95
    assert {k: v for k, v in ping.items() if k != "--inter-gbps"} == \
        {k: v for k, v in allreduce.items() if k != "--inter-gbps"}


def _link(pair_s=None, all_s=1.0, latency_us=90.0):
    link = {"hosts": ["h1"] * 2 + ["h2"] * 2, "ranks_per_host": 2, "model_mb": 20.0,
            "links": {"inter": {"latency_us": latency_us, "gbps": 0.95, "bandwidth_Bps": 1e8},
                      "intra": {"latency_us": 80.0, "gbps": 27.0, "bandwidth_Bps": 3e9}},
            "allreduce_s": {"all ranks": all_s}}
    if pair_s is not None:
        link["allreduce_s"]["a pair across hosts"] = pair_s
    return link


def test_several_link_runs_give_their_medians_and_only_what_every_run_measured():
    merged = sim_hosts.median_link([_link(0.5, 1.0, 90.0), _link(0.3, 3.0, 240.0),
                                    _link(None, 2.0, 100.0)])
    assert merged["allreduce_s"] == {"all ranks": 2.0}
    assert merged["links"]["inter"]["latency_us"] == 100.0
    with pytest.raises(SystemExit, match="different clusters"):
        sim_hosts.median_link([_link(), {**_link(), "model_mb": 2.0}])


def test_the_pair_calibration_adds_the_bandwidth_that_reproduces_the_measured_pair():
    assert "allreduce_pair" not in sim_hosts.calibrations(_link())
    flags = sim_hosts.calibrations(_link(pair_s=0.4))
    pair = dict(zip(flags["allreduce_pair"][::2], flags["allreduce_pair"][1::2]))
    assert flags["allreduce_pair"][:len(flags["allreduce"])] == flags["allreduce"]
    gbps = float(pair["--inter-pair-gbps"])
    network = Network(workers_per_node=2, inter=Link(90e-6, 1.0),
                      inter_pair_Bps=gbps * 1e9 / 8)
    assert network.allreduce_s(20e6, 2, 2) == pytest.approx(0.4, rel=1e-3)


def test_the_fair_calibration_is_the_last_one_with_fair_links_and_a_step_spread():
    fair_tail = ["--link-sharing", "fair", "--step-jitter", "0.02"]
    paired = sim_hosts.calibrations(_link(pair_s=0.4))
    assert paired["fair"] == paired["allreduce_pair"] + fair_tail
    unpaired = sim_hosts.calibrations(_link())
    assert unpaired["fair"] == unpaired["allreduce"] + fair_tail
    ringed = sim_hosts.calibrations({**_link(pair_s=0.4), "ring_s": {"all ranks": 0.5}})
    assert ringed["fair"] == ringed["ring"] + fair_tail  # what ripples runs, where measured


def test_the_ring_calibration_reproduces_the_measured_ring_of_all_ranks_and_of_a_pair():
    assert "ring" not in sim_hosts.calibrations(_link())
    link = {**_link(), "ring_s": {"all ranks": 0.5, "a pair across hosts": 0.3}}
    flags = dict(zip(sim_hosts.calibrations(link)["ring"][::2],
                     sim_hosts.calibrations(link)["ring"][1::2]))
    network = Network(workers_per_node=2,
                      inter=Link(90e-6, float(flags["--inter-gbps"]) * 1e9 / 8),
                      inter_pair_Bps=float(flags["--inter-pair-gbps"]) * 1e9 / 8)
    assert network.allreduce_s(20e6, 4, 4) == pytest.approx(0.5, rel=1e-3)
    assert network.allreduce_s(20e6, 2, 2) == pytest.approx(0.3, rel=1e-3)
    merged = sim_hosts.median_link([link, {**link, "ring_s": {"all ranks": 0.7}}, link])
    assert merged["ring_s"] == {"all ranks": 0.5}


@pytest.mark.parametrize("model_mb,taken", [(20.0, "ring_s"), (2.0, "allreduce_s")])
def test_the_ring_calibration_takes_the_intra_host_bandwidth_from_what_ripples_runs_there(
        model_mb, taken):
    # From 16 MiB ripples runs its ring within a host, below it MPI.Allreduce: the on-host
    # bandwidth is fitted to the one it runs at the link's payload, not to the ping-pong.
    on_host = "each host's ranks, all hosts at once"
    link = {**_link(), "model_mb": model_mb,
            "ring_s": {"all ranks": 0.5, on_host: 0.03}}
    link["allreduce_s"] = {**link["allreduce_s"], on_host: 0.01}
    flags = dict(zip(sim_hosts.calibrations(link)["ring"][::2],
                     sim_hosts.calibrations(link)["ring"][1::2]))
    network = Network(workers_per_node=2,
                      intra=Link(80e-6, float(flags["--intra-gbps"]) * 1e9 / 8))
    assert network.allreduce_s(model_mb * 1e6, 2, 1) == pytest.approx(link[taken][on_host],
                                                                      rel=1e-3)
    ring = sim_hosts.calibrations(link)["ring"]
    assert ring.count("--intra-gbps") == 1
    unmeasured = sim_hosts.calibrations({**_link(), "ring_s": {"all ranks": 0.5}})
    assert unmeasured["ring"][:6] == unmeasured["pingpong"][:6]  # the ping-pong's intra link


def test_compute_flags_are_the_medians_of_the_measured_step_spread():
    runs = [{"step_ms": 50.0, "step_jitter": 0.03, "update_ms": 9.0},
            {"step_ms": 52.0, "step_jitter": 0.02, "update_ms": 12.0},
            {"step_ms": 51.0, "step_jitter": 0.04, "update_ms": 8.0}]
    assert sim_hosts.compute_flags(runs) == ["--step-ms", "51.0000", "--step-jitter", "0.0300",
                                             "--update-ms", "9.0000"]


def test_the_lognormal_spread_recovers_the_sigma_of_lognormal_times():
    import numpy as np
    import step_spread
    times = np.exp(0.05 * np.random.default_rng(0).standard_normal(20000)) * 0.05
    assert step_spread.lognormal_spread(times.tolist()) == pytest.approx(0.05, rel=0.05)
    assert step_spread.lognormal_spread([0.05] * 10) == 0.0
