"""Checking a PSOptimizer's arguments, locally (``configure``) and across workers (``agree``)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from ..core.errors import MismatchError
from . import placement as placement_mod
from . import policies
from . import psld as psld_mod
from .community import CommunityStep


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the arguments of one PSOptimizer resolve to.

    ``names``/``params``/``groups``: every parameter's name, tensor and optimizer group
    index, in a fixed order; ``map``: the chunk map (``placement.ChunkMap``); ``psld``: a
    ``psld.PSLDConfig`` or None.
    """

    spec: policies.PolicySpec
    names: List[str]
    params: List[torch.Tensor]
    groups: List[int]
    map: placement_mod.ChunkMap
    psld: Optional[psld_mod.PSLDConfig]
    timeout_s: float
    link_delay_s: float


def configure(optimizer, named_parameters, context, policy, staleness, placement, chunk_bytes,
              eager_scale, max_lag, coupled, timeout_s, backup_workers, link_delay_s,
              communities, regroup_every, tasks_per_clock, rebalance_every, psld,
              controller) -> Setup:
    """Validate the arguments of ``PSOptimizer`` on this worker (see its docstring for their
    meaning); raises TypeError, ValueError or RipplesError naming the argument."""
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if not isinstance(link_delay_s, (int, float)) or link_delay_s < 0:
        raise ValueError(f"link_delay_s must be a number >= 0, got {link_delay_s!r}")
    spec = policies.make_spec(policy, context.num_workers, staleness, backup_workers,
                              eager_scale, max_lag, coupled, communities, regroup_every,
                              tasks_per_clock, rebalance_every)
    if policy == "casp":
        CommunityStep.check_runtime(context.num_workers)
    names, params, groups = _collect(optimizer, named_parameters)
    infos = [placement_mod.ParamInfo(n, p.numel(), p.element_size())
             for n, p in zip(names, params)]
    active = context.num_servers - context.spare
    chunk_map = placement_mod.plan(infos, active, placement, chunk_bytes)
    if context.spare:
        chunk_map = dataclasses.replace(chunk_map, num_servers=context.num_servers,
                                        active=tuple(range(active)))
    if psld is True:
        psld = psld_mod.PSLDConfig()
    if psld is not None and not isinstance(psld, psld_mod.PSLDConfig):
        raise TypeError(f"psld must be None, True or a ripples.ps.psld.PSLDConfig, got {psld!r}")
    if psld is not None and policy != "bsp":
        raise ValueError(f"psld moves chunks at BSP round boundaries: use policy='bsp' "
                         f"with psld (got policy={policy!r})")
    if controller is not None and not callable(controller):
        raise TypeError("controller must be None or a callable controller(ps_optimizer)")
    return Setup(spec, names, params, groups, chunk_map, psld, float(timeout_s),
                 float(link_delay_s))


def agree(worker_comm, problem: Optional[Exception], setup: Optional[Setup], arguments) -> None:
    """Collective over the workers: raise ``problem`` where it happened and MismatchError
    everywhere else, or MismatchError on every worker when the models (names, shapes,
    dtypes) or the ``arguments`` differ between workers."""
    params = [] if problem else list(zip(setup.names, setup.params))
    mine = {"params": [(n, tuple(p.shape), str(p.dtype)) for n, p in params],
            "arguments": repr(arguments), "problem": repr(problem) if problem else None}
    everyone = worker_comm.allgather(mine)
    if problem is not None:
        raise problem
    for worker, theirs in enumerate(everyone):
        if theirs["problem"]:
            raise MismatchError(f"worker {worker} rejected its PSOptimizer arguments: "
                                f"{theirs['problem']}")
    reference = everyone[0]
    for worker, theirs in enumerate(everyone):
        if theirs == reference:
            continue
        if theirs["arguments"] != reference["arguments"]:
            raise MismatchError(f"PSOptimizer arguments differ: worker 0 {reference['arguments']}"
                                f", worker {worker} {theirs['arguments']}")
        raise MismatchError("models differ between workers: "
                            + _first_difference(reference["params"], theirs["params"], worker))


def _collect(optimizer, named_parameters):
    """Names, tensors and optimizer group index of every parameter, in a fixed order."""
    group_of = {}
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            group_of[id(p)] = index
    names, params, groups, seen = [], [], [], set()
    for item in named_parameters:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError("named_parameters must yield (name, tensor) pairs, as "
                            "model.named_parameters() does")
        name, p = item
        if id(p) in seen:
            continue
        if id(p) not in group_of:
            raise ValueError(f"named_parameters: {name!r} is not among the optimizer's parameters")
        seen.add(id(p))
        names.append(name)
        params.append(p)
        groups.append(group_of[id(p)])
    if len(seen) != len(group_of):
        raise ValueError(f"named_parameters names {len(seen)} tensors but the optimizer holds "
                         f"{len(group_of)}; pass model.named_parameters() of the optimized model")
    return names, params, groups


def _first_difference(reference, theirs, worker) -> str:
    for a, b in zip(reference, theirs):
        if a != b:
            return (f"worker 0 has {a[0]!r} shape {a[1]} {a[2]}, worker {worker} has "
                    f"{b[0]!r} shape {b[1]} {b[2]}")
    return (f"worker 0 has {len(reference)} parameter tensors, worker {worker} has "
            f"{len(theirs)}")
