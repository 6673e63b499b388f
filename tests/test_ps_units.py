"""Pure logic of the parameter-server mode: placements, policies and how optimizer state
is cut into chunks and put back together (no processes)."""
import math

import pytest
import torch

from ripples.ps import placement as pl
from ripples.ps import policies as po
from ripples.ps.checkpoint import _assemble
from ripples.ps.transport import state_from_wire, state_to_wire

PARAMS = [pl.ParamInfo("embed", 3_000_000, 4), pl.ParamInfo("w1", 1000, 4),
          pl.ParamInfo("b1", 10, 4), pl.ParamInfo("w2", 2_500_000, 2), pl.ParamInfo("empty", 0, 4)]


@pytest.mark.parametrize("name", sorted(pl.PLACEMENTS))
@pytest.mark.parametrize("servers", [1, 2, 3, 5])
def test_every_element_has_exactly_one_owner(name, servers):
    m = pl.plan(PARAMS, servers, name, chunk_bytes=1 << 20)
    owned = {}
    for c, s in zip(m.chunks, m.owners):
        assert 0 <= s < servers
        for e in (c.start, c.stop - 1) if c.stop > c.start else ():
            owned.setdefault((c.param, e), []).append(s)
        if name == "mxnet":  # whole small tensors, big ones cut into one slice per server
            p = PARAMS[c.param]
            assert c.stop - c.start in (p.numel, p.numel // servers, -(-p.numel // servers))
        else:
            assert c.nbytes <= 1 << 20
    for i, p in enumerate(PARAMS):
        spans = sorted((c.start, c.stop) for c in m.chunks if c.param == i)
        assert spans[0][0] == 0 and spans[-1][1] == p.numel
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert sum(m.bytes_per_server()) == sum(p.numel * p.itemsize for p in PARAMS)
    assert m == pl.plan(PARAMS, servers, name, chunk_bytes=1 << 20)  # deterministic


def test_roundrobin_and_mxnet_rules():
    m = pl.plan(PARAMS, 3, "roundrobin", chunk_bytes=1 << 20)
    assert list(m.owners) == [i % 3 for i in range(len(m.chunks))]
    m = pl.plan(PARAMS, 3, "mxnet", chunk_bytes=1 << 20)
    small = [(c.param, s) for c, s in zip(m.chunks, m.owners) if PARAMS[c.param].numel * 4 <= 1 << 20]
    assert small == [(1, 9973 % 3), (2, 2 * 9973 % 3), (4, 4 * 9973 % 3)]
    big = [(c.stop - c.start, s) for c, s in zip(m.chunks, m.owners) if c.param == 0]
    assert big == [(1_000_000, 0), (1_000_000, 1), (1_000_000, 2)]


def test_greedy_balances_bytes_better_than_roundrobin():
    params = [pl.ParamInfo(f"p{i}", n, 4) for i, n in enumerate([900, 10, 10, 800, 10, 700, 5])]
    greedy = pl.plan(params, 3, "greedy", chunk_bytes=1 << 20).bytes_per_server()
    rr = pl.plan(params, 3, "roundrobin", chunk_bytes=1 << 20).bytes_per_server()
    assert max(greedy) - min(greedy) < max(rr) - min(rr)
    assert sorted(greedy) == [4 * 735, 4 * 800, 4 * 900]  # largest first, to the lightest


def test_hash_is_stable_across_processes():
    # CRC-32 of "name:index", not Python's salted hash.
    import zlib
    m = pl.plan([pl.ParamInfo("w", 10, 4)], 7, "hash")
    assert m.owners == (zlib.crc32(b"w:0") % 7,)


def test_placement_arguments_and_invalid_callables():
    with pytest.raises(ValueError, match="placement must be one of"):
        pl.plan(PARAMS, 2, "random")
    with pytest.raises(ValueError, match="num_servers"):
        pl.plan(PARAMS, 0)
    with pytest.raises(ValueError, match="gap"):
        pl.plan(PARAMS[:1], 2, lambda p, s, b: ([pl.Chunk(0, 0, 1, 3_000_000, 4)], [0]))
    with pytest.raises(ValueError, match="server 5"):
        pl.plan(PARAMS[:1], 2, lambda p, s, b: ([pl.Chunk(0, 0, 0, 3_000_000, 4)], [5]))


def test_policy_validation_names_valid_values():
    with pytest.raises(ValueError, match="policy must be one of"):
        po.make_spec("bulk", 4)
    for bad in (None, -1, 1.5, True):
        with pytest.raises(ValueError, match="staleness"):
            po.make_spec("ssp", 4, staleness=bad)
    with pytest.raises(ValueError, match="staleness applies only"):
        po.make_spec("bsp", 4, staleness=2)
    with pytest.raises(ValueError, match="eager_scale"):
        po.make_spec("eager", 4, eager_scale="log")
    with pytest.raises(ValueError, match="backup_workers"):
        po.make_spec("syncopt", 4, backup_workers=4)
    assert po.make_spec("ssp", 4, staleness=0).staleness == 0
    assert po.make_spec("syncopt", 4, backup_workers=1).quorum == 3
    assert po.make_spec("bsp", 4).quorum == 4


def test_ssp_gate():
    assert po.ssp_may_start(5, [5, 5, 5], 0)
    assert not po.ssp_may_start(6, [6, 5, 6], 0)
    assert po.ssp_may_start(7, [7, 5], 2)
    assert not po.ssp_may_start(8, [8, 5], 2)
    assert po.ssp_may_start(3, [], 0)  # alone


def test_scales():
    assert [po.dynsgd_factor(d) for d in range(3)] == [1.0, 0.5, 1 / 3]
    assert po.expected_tau(newest_seen=10, computed_on=7, in_flight=2) == 6
    assert po.expected_tau(newest_seen=7, computed_on=7, in_flight=0) == 1
    assert po.eager_factor(4, "inverse") == 0.25
    assert po.eager_factor(4, "sqrt") == 0.5
    assert po.eager_factor(4, "constant") == 1.0
    assert math.isclose(po.eager_factor(3, "sqrt"), 3 ** -0.5)
    with pytest.raises(ValueError):
        po.eager_factor(0)
    spec = po.make_spec("consgd", 4)
    assert po.apply_factor(spec, 3, 1.0) == 0.25
    assert po.apply_factor(po.make_spec("dynsgd", 4), 3, 1.0) == 0.25
    assert po.apply_factor(po.make_spec("eager", 4), 3, 0.4) == 0.4
    assert po.apply_factor(po.make_spec("asp", 4), 3, 0.4) == 1.0


def test_bsp_rounds_wait_for_every_active_worker():
    rounds = po.Rounds(quorum=3)
    assert rounds.offer(0, 0) and rounds.offer(1, 0) and rounds.offer(1, 1)
    assert not rounds.ready({0, 1, 2}) and rounds.missing({0, 1, 2}) == [2]
    assert rounds.ready({0, 1})  # worker 2 joined
    assert rounds.close() == ([0, 1], [])
    assert rounds.applied == 1 and not rounds.offer(2, 0)  # closed round: dropped
    with pytest.raises(ValueError, match="twice"):
        rounds.offer(1, 1)


def test_syncopt_rounds_take_the_first_quorum():
    rounds = po.Rounds(quorum=2)
    for w in (3, 1):
        rounds.offer(w, 0)
    assert rounds.ready({0, 1, 2, 3})
    assert rounds.close() == ([3, 1], [])
    assert not rounds.offer(0, 0)


def test_pull_ready_by_policy():
    bsp = po.make_spec("bsp", 2)
    assert not po.pull_ready(bsp, after_round=3, rounds_applied=2, own_pushes=3, active_pushes=[3, 2])
    assert po.pull_ready(bsp, after_round=3, rounds_applied=3, own_pushes=3, active_pushes=[3, 3])
    ssp = po.make_spec("ssp", 2, staleness=1)
    assert po.pull_ready(ssp, 0, 0, own_pushes=4, active_pushes=[4, 3])
    assert not po.pull_ready(ssp, 0, 0, own_pushes=5, active_pushes=[5, 3])
    assert po.pull_ready(po.make_spec("asp", 2), 9, 0, 9, [9, 0])


def test_optimizer_state_split_into_chunks_and_reassembled():
    param = torch.arange(12.0).reshape(3, 4)
    state = {"exp_avg": param * 2, "step": torch.tensor(5.0), "flag": None}
    bounds = [(0, 5), (5, 12)]
    wires = [state_to_wire(state, param.shape, a, b) for a, b in bounds]
    chunk = state_from_wire(wires[1])  # what a server holds for elements 5..11
    assert torch.equal(chunk["exp_avg"], (param * 2).reshape(-1)[5:])
    assert chunk["step"].shape == () and chunk["step"].item() == 5.0
    # the server sends a chunk's state back with the chunk's own (flat) shape
    back = [state_to_wire(state_from_wire(w), torch.Size([b - a]), 0, b - a)
            for w, (a, b) in zip(wires, bounds)]
    assembled = _assemble(param, back)
    assert torch.equal(assembled["exp_avg"], param * 2)
    assert assembled["step"].shape == () and assembled["flag"] is None
