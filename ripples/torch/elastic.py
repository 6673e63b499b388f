"""Horovod's elastic API on ripples: ``hvd.elastic.run``, ``hvd.elastic.TorchState`` and
``hvd.elastic.ElasticSampler``, for training that survives dead ranks.

With ``Config.fault_tolerant`` (``ripplesrun --fault-tolerant``), a rank that dies makes the
survivors' next collective raise ``HorovodInternalError`` (``ripples.RanksFailedError``)
after they have moved onto a smaller world. ``run`` catches it, rolls the state back to its
last ``commit()``, calls the reset callbacks, makes every survivor agree on rank 0's state
(``sync()``), and calls the training function again. What ran since the last commit is
redone on the survivors; the dead ranks' work since then is lost.

Growing back is a restart, not MPI dynamic processes: under ``ripplesrun --min-np N
--max-np M`` (``Config.elastic_dir``, ``min_np``, ``max_np``) every ``commit()`` is also
written to the elastic directory by rank 0. A world smaller than ``M`` stops at its next
``commit()``, and one smaller than ``N`` stops as soon as it has rolled back: rank 0 asks
the launcher for a restart, every rank leaves ``run`` with ``SystemExit(EXIT_RESTART)``,
and the launcher starts the job again on ``M`` ranks, where ``run`` resumes from that
commit. One elastic state per job: the commit on disk is restored into the state of the
first ``run`` call of each launch. ``HostsUpdatedInterrupt`` exists for scripts that catch
it, and ripples never raises it.

Typical use, as with Horovod::

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch):
                ...
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)
"""
from __future__ import annotations

import copy
import functools
import math
import sys
from typing import Any, Callable, Iterable, List, Optional

import torch

from ripples.runner import elastic_restart
from ripples import runtime as _runtime
from ripples.core.errors import RanksFailedError, RipplesError
from ripples.ops.collectives import allgather_object, broadcast_object
from ripples.core.optim_wrapper import OptimizerWrapper
from ripples.torch.functions import broadcast_optimizer_state, broadcast_parameters
from ripples.torch.replicas import own_replica_read

HorovodInternalError = RanksFailedError
_resumed = False  # the commit of a previous launch was looked for (once per process)


class HostsUpdatedInterrupt(RipplesError):
    """Horovod's signal that hosts were added or removed. ripples never raises it (the
    world only shrinks, and that raises ``HorovodInternalError``); ``run`` handles it as
    Horovod does, for scripts that raise it themselves."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class RestartForGrowth(RipplesError):
    """The world is smaller than ``ripplesrun --max-np`` (or ``--min-np``) asks for: the
    last commit is on disk and the launcher restarts the job on more ranks. ``run`` turns
    it into ``SystemExit(EXIT_RESTART)``."""


class State:
    """State kept in step on every rank and rolled back together: ``commit()`` saves it,
    ``restore()`` brings back the last commit, ``sync()`` copies rank 0's to every rank.
    Extra keyword arguments become attributes (``state.epoch``) handled the same way."""

    def __init__(self, **attributes):
        self._reset_callbacks: List[Callable[[], None]] = []
        self._attributes = dict(attributes)
        self._saved_attributes: dict = {}
        for name, value in attributes.items():
            setattr(self, name, value)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call each of ``callbacks`` after every reset (the world shrank), before
        ``sync()``: e.g. to scale the learning rate to the new ``size()``."""
        callbacks = list(callbacks)
        for callback in callbacks:
            if not callable(callback):
                raise TypeError(f"register_reset_callbacks takes callables, got {callback!r}")
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state: a later failure rolls back to here. Under ``ripplesrun
        --max-np`` rank 0 also writes it to the elastic directory, and a world smaller than
        ``max_np`` stops here for a restart (see the module docstring)."""
        self.save()
        self.persist()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``RestartForGrowth`` when the launcher can restart the job on more ranks
        (``Config.max_np`` above the current size)."""
        rt = _runtime.current()
        wanted = _training_ranks(rt.config, rt.config.max_np)
        if rt.config.elastic_dir and rt.size < wanted:
            self.stop_for_restart(f"the world has {rt.size} training ranks, {wanted} wanted")

    def stop_for_restart(self, reason: str) -> None:
        """Ask the launcher for a restart from the commit on disk (rank 0), then raise
        ``RestartForGrowth`` on every rank."""
        rt = _runtime.current()
        if rt.rank == 0:
            elastic_restart.request_restart(rt.config.elastic_dir, reason)
        raise RestartForGrowth(reason)

    def persisted(self) -> dict:
        """What ``persist`` writes: the last commit."""
        return {"attributes": self._saved_attributes}

    def load_persisted(self, saved: dict) -> None:
        """Make ``saved`` (from ``persisted``) the last commit and restore it."""
        self._saved_attributes = saved["attributes"]
        self.restore()

    def persist(self) -> None:
        """Rank 0 writes the last commit to the elastic directory, if there is one."""
        rt = _runtime.current()
        if rt.config.elastic_dir and rt.rank == 0:
            elastic_restart.write_atomically(
                elastic_restart.state_path(rt.config.elastic_dir),
                lambda temporary: torch.save(self.persisted(), temporary))

    def resume(self) -> bool:
        """Rank 0 loads the commit a previous launch left in the elastic directory (then
        ``sync()`` hands it to every rank), once per process. Returns whether it did."""
        global _resumed
        rt = _runtime.current()
        if not rt.config.elastic_dir or rt.rank != 0 or _resumed:
            return False
        _resumed = True
        path = elastic_restart.state_path(rt.config.elastic_dir)
        if not path.exists():
            return False
        # The file is this job's own commit, written by rank 0 of the previous launch.
        self.load_persisted(torch.load(path, weights_only=False))
        return True

    def save(self) -> None:
        self._saved_attributes = {name: copy.deepcopy(getattr(self, name))
                                  for name in self._attributes}

    def restore(self) -> None:
        for name, value in self._saved_attributes.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self) -> None:
        """Make every rank's attributes rank 0's (collective), then save them."""
        if self._attributes:
            values = broadcast_object({name: getattr(self, name) for name in self._attributes},
                                      root_rank=0)
            for name, value in values.items():
                setattr(self, name, value)
        self.save()


class ObjectState(State):
    """A ``State`` of plain Python attributes (Horovod's ``ObjectState``)."""


class TorchState(State):
    """A model, an optimizer and plain attributes, kept in step across ranks.

    ``model``: a ``torch.nn.Module`` (its ``state_dict``); ``optimizer``: a torch optimizer
    or ripples' ``DistributedOptimizer`` (the wrapped optimizer's state is saved; in
    parameter-server mode, where the servers hold the parameters and the optimizer's state,
    rank 0 saves the servers' state at each commit, and a launch that resumes from a commit
    loads it back onto the servers in ``sync()``, collectively); further keyword arguments
    become attributes. An ``ElasticSampler`` among them is saved,
    restored, synchronized and re-partitioned with the rest.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None, optimizer=None, **attributes):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchState(model=...) takes a torch.nn.Module, got "
                            f"{type(model).__name__}")
        self.model = model
        self.optimizer = optimizer
        samplers = {k: v for k, v in attributes.items() if isinstance(v, ElasticSampler)}
        self._samplers = samplers
        super().__init__(**{k: v for k, v in attributes.items() if k not in samplers})
        for name, sampler in samplers.items():
            setattr(self, name, sampler)
        self._saved_model = None
        self._saved_optimizer = None
        self._saved_samplers: dict = {}
        self._servers_to_load = None  # PS mode: a resumed commit's server state, for sync()
        self.save()

    def commit(self) -> None:
        """Save the state. With an ``ElasticSampler`` among the attributes this is
        collective (every rank commits at the same point, as in all-reduce training): the
        samples every rank has processed are merged first, so that a rank dying later does
        not take the record of its processed samples with it (they are not processed
        twice)."""
        for sampler in self._samplers.values():
            # Only the record: this epoch's partition (being iterated) stays as it is.
            sampler.processed_indices = _processed_by_all(sampler)
        super().commit()

    def _inner_optimizer(self):
        optimizer = self.optimizer
        return optimizer.optimizer if isinstance(optimizer, OptimizerWrapper) else optimizer

    def persisted(self) -> dict:
        return dict(super().persisted(), model=self._saved_model,
                    optimizer=self._saved_optimizer, samplers=self._saved_samplers)

    def load_persisted(self, saved: dict) -> None:
        self._saved_model = saved["model"]
        self._saved_optimizer = saved["optimizer"]
        if _on_servers(self.optimizer):
            self._servers_to_load = saved["optimizer"]
        self._saved_samplers = saved["samplers"]
        super().load_persisted(saved)

    def save(self) -> None:
        super().save()
        if self.model is not None:
            with own_replica_read():
                self._saved_model = copy.deepcopy(self.model.state_dict())
        if _on_servers(self.optimizer):
            # Only rank 0 persists a commit; asking the servers costs their whole state.
            if _runtime.current().rank == 0:
                self._saved_optimizer = self.optimizer.state_dict()
        elif self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self._inner_optimizer().state_dict())
        self._saved_samplers = {name: sampler.state_dict()
                                for name, sampler in self._samplers.items()}

    def restore(self) -> None:
        super().restore()
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        # In PS mode the servers outlive a dead worker and stay the truth (the next pull
        # brings their parameters); a resumed commit reaches them in sync().
        if self.optimizer is not None and not _on_servers(self.optimizer):
            self._inner_optimizer().load_state_dict(copy.deepcopy(self._saved_optimizer))
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[name])

    def sync(self) -> None:
        """Make every rank's model, optimizer, attributes and samplers rank 0's
        (collective), then save them."""
        if self.model is not None:
            with own_replica_read():
                model_state = self.model.state_dict()
            broadcast_parameters(model_state, root_rank=0)
        if _on_servers(self.optimizer):
            servers_state = broadcast_object(self._servers_to_load, root_rank=0)
            self._servers_to_load = None
            if servers_state is not None:  # every worker: loading is collective
                self.optimizer.load_state_dict(servers_state)
        elif self.optimizer is not None:
            broadcast_optimizer_state(self._inner_optimizer(), root_rank=0)
        for sampler in self._samplers.values():
            # Every rank's processed samples count, and rank 0's epoch.
            processed = _processed_by_all(sampler)
            epoch = broadcast_object(sampler.epoch, root_rank=0)
            sampler.load_state_dict({"epoch": epoch, "processed_indices": sorted(processed)})
        super().sync()

    def on_reset(self) -> None:
        for sampler in self._samplers.values():
            sampler.reset()
        super().on_reset()


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ``ElasticSampler``: a ``DistributedSampler`` whose partition follows the
    world as it shrinks, and which skips the samples already processed this epoch.

    Call ``record_batch(batch_idx, batch_size)`` (or ``record_indices``) after each batch,
    and ``set_epoch(epoch)`` at each epoch. After a reset, the samples not yet processed in
    this epoch are shared among the survivors.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the samples of batch ``batch_idx`` of this rank processed."""
        start = batch_idx * batch_size
        self.record_indices(self.indices[start:start + batch_size])

    def record_indices(self, indices: Iterable[int]) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self) -> dict:
        """This rank's view (local; ``TorchState.sync`` merges every rank's)."""
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Partition the samples not processed yet among the current world."""
        rt = _runtime.current()
        self.rank, self.num_replicas = rt.rank, rt.size
        order = list(range(len(self.dataset)))
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        remaining = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(remaining) / self.num_replicas)
        padded = remaining + remaining[:self.num_samples * self.num_replicas - len(remaining)]
        self.indices = padded[self.rank::self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


def _on_servers(optimizer) -> bool:
    """Whether ``optimizer`` is a parameter-server optimizer (its state lives on servers)."""
    from ripples.ps.optimizer import PSOptimizer
    return isinstance(optimizer, PSOptimizer)


def _processed_by_all(sampler: "ElasticSampler") -> set:
    """The samples every rank's ``sampler`` has processed this epoch (collective)."""
    return {i for part in allgather_object(sorted(sampler.processed_indices)) for i in part}


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a training function ``func(state, *args, **kwargs)`` so that it survives
    dead ranks: on ``HorovodInternalError`` the state is restored to its last commit, the
    reset callbacks run, and ``func`` is called again on the survivors after ``sync()``.
    ``state`` must be a ``State`` (e.g. ``TorchState``). Under ``ripplesrun --min-np/--max-np``
    it first resumes from the commit a previous launch left, and it ends the process with
    ``EXIT_RESTART`` when the job stops for a restart on more ranks."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError("hvd.elastic.run: the decorated function's first argument must be "
                            f"a hvd.elastic.State (e.g. TorchState), got {type(state).__name__}")
        state.resume()
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                    _stop_if_below_min_np(state)
                except HostsUpdatedInterrupt as interrupt:
                    skip_sync = interrupt.skip_sync
                state.on_reset()
        except RestartForGrowth as stop:
            if _runtime.current().rank == 0:
                print(f"ripples: stopping for a restart from the last commit: {stop}",
                      file=sys.stderr, flush=True)
            raise SystemExit(elastic_restart.EXIT_RESTART) from None

    return wrapper


def _training_ranks(config, launched: int) -> int:
    """How many of ``launched`` ranks train: all but the parameter servers in PS mode."""
    return launched - (config.ps_servers + config.ps_spare if config.ps_servers else 0)


def _stop_if_below_min_np(state: State) -> None:
    rt = _runtime.current()
    if rt.config.elastic_dir and rt.size < _training_ranks(rt.config, rt.config.min_np):
        # Rank 0 of the first world may have died writing the last commit.
        state.persist()
        state.stop_for_restart(f"the world shrank to {rt.size} ranks, below min_np "
                               f"{rt.config.min_np}")
