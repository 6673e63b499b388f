"""The learned CASP community controller (``communities="learned"``): an actor-critic that
chooses the number of communities ``C``; sort-and-cut then forms them.

- *State*: the workers' speeds (fastest time / own time, sorted fastest first, zero-padded
  to ``MAX_WORKERS``), the number of workers, the current ``C``, the current plan's mean
  staleness (``casp_timing.mean_staleness``) and the loss slope, each scaled into [0, 1]
  or [-1, 1].
- *Action*: ``C`` in ``1..n`` (the actor's logits for larger counts are masked).
- *Reward*: ``casp_timing.reward`` of the sort-and-cut plan, i.e. progress per second minus
  the traffic penalty, the same objective as ``casp_scoring.choose()`` (which sees compute times
  only, where this model adds push, pull and server costs), with times in multiples of
  the fastest worker's time.
- *Model* (``ActorCritic``): the critic is a two-layer MLP on the state vector; the actor
  scores each candidate ``C`` with one small MLP shared by all candidates, from the state's
  scalars and what the sort-and-cut plan of that ``C`` would look like (``candidates``:
  ``C / n``, the fraction of a round its members idle, its throughput, its staleness and
  its pushes per batch). A first version read ``C`` off the speed vector with a plain
  policy head; it collapsed onto one ``C`` for every cluster, since ``C = 2`` is never far
  from the best and the head learns that before it learns the speeds. Trained by
  ``benchmarks/train_casp_controller.py`` (A3C: asynchronous actor threads updating one
  shared model) against ``casp_timing``; the weights ship as ``casp_controller.pt`` next
  to this file (about 30 KB).

Choices where the published description is silent, and why:

- *Inference is greedy* (the most likely ``C``): every server 0 of a run must not draw a
  different plan from the same measurements by chance, and tests must be deterministic.
- *Discount 0* (the advantage is reward minus value): in the timing model the chosen ``C``
  does not change the next speeds, so future rewards do not depend on it and a discount
  above 0 would only add variance.
- *Online learning is on by default* with a small learning rate (``ONLINE_LR``): at each
  regroup, the previous choice is rewarded with the timing model's reward on the speeds
  measured under it, and one actor-critic step is taken on the server's own copy of the
  model (the shipped file is never written). It adapts the policy to speeds the training
  mixes did not cover; pass ``online=False`` for a fixed policy.
- *The loss slope* is part of the state as in the paper, but the servers do not see the
  loss, so a real run feeds 0; training draws it at random so that the policy does not
  depend on it.
- *More than* ``MAX_WORKERS`` *workers*: the model has no input for them, so the choice
  falls back to ``casp_scoring.choose()``.
"""
from __future__ import annotations

import pathlib
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from . import casp_scoring, casp_timing
from .casp_scoring import DEFAULT_TRAFFIC_PENALTY, Communities, sort_and_cut

MAX_WORKERS = 16
FEATURES = MAX_WORKERS + 4
CANDIDATE_FEATURES = 5 + 4
HIDDEN = 64
ENTROPY_BETA = 0.01
ONLINE_LR = 1e-4
WEIGHTS = pathlib.Path(__file__).with_name("casp_controller.pt")


class ActorCritic(nn.Module):
    """(state ``x``, candidates ``cand``) -> (logits over ``C = 1..MAX_WORKERS``, value)."""

    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(),
                                    nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
        self.actor = nn.Sequential(nn.Linear(CANDIDATE_FEATURES, HIDDEN), nn.Tanh(),
                                   nn.Linear(HIDDEN, 1))

    def forward(self, x: torch.Tensor, cand: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        tail = x[..., MAX_WORKERS:].unsqueeze(-2).expand(*cand.shape[:-1], 4)
        logits = self.actor(torch.cat([cand, tail], -1)).squeeze(-1)
        return logits, self.critic(x).squeeze(-1)


def relative(times: Sequence[float]) -> list:
    """Times in multiples of the fastest worker's time (the unit of the timing model)."""
    fastest = min(times)
    return [t / fastest for t in times]


def features(times: Sequence[float], count: int, staleness: float,
             loss_slope: float = 0.0) -> torch.Tensor:
    """The state vector of ``len(times) <= MAX_WORKERS`` workers under ``count`` communities
    with mean ``staleness``; ``loss_slope`` is clipped to [-1, 1]."""
    n = len(times)
    speeds = sorted((min(times) / t for t in times), reverse=True)
    x = speeds + [0.0] * (MAX_WORKERS - n)
    x += [n / MAX_WORKERS, count / n, min(staleness / n, 1.0), max(-1.0, min(1.0, loss_slope))]
    return torch.tensor(x, dtype=torch.float32)


def candidates(times: Sequence[float]) -> torch.Tensor:
    """For each ``C = 1..MAX_WORKERS`` (zeros above ``len(times)``), in the timing model:
    ``C / n``, the mean fraction of a round a worker does not compute (it waits for its
    slowest or for the servers), batches per
    second per worker, mean staleness / n, and pushes per batch of sort-and-cut into ``C``."""
    n = len(times)
    rows = torch.zeros(MAX_WORKERS, 5)
    for count in range(1, n + 1):
        plan = sort_and_cut(times, count)
        rounds = casp_timing.round_times(times, plan)
        wait = sum((r - times[w]) / r for c, r in zip(plan, rounds) for w in c) / n
        batches = sum(len(c) / r for c, r in zip(plan, rounds))
        pushes = sum(1 / r for r in rounds)
        stale = sum(len(c) * s for c, s in zip(plan, casp_timing.staleness(rounds))) / n
        rows[count - 1] = torch.tensor([count / n, wait, batches / n, stale / n, pushes / batches])
    return rows


def gain(times: Sequence[float], count: int,
         traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY) -> float:
    """The reward of ``count`` as a gain over one community (BSP), the scale the model is
    trained on. Dividing by a quantity of the state alone keeps the best ``C`` of each
    state and puts clusters of 2..16 workers on one scale."""
    return (casp_timing.count_reward(times, count, traffic_penalty)
            / casp_timing.count_reward(times, 1, traffic_penalty) - 1)


def masked_logits(logits: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Logits with the counts above each state's number of workers set to -inf."""
    counts = torch.arange(1, MAX_WORKERS + 1)
    return logits.masked_fill(counts > sizes.unsqueeze(-1), float("-inf"))


def sizes_of(x: torch.Tensor) -> torch.Tensor:
    """Number of workers encoded in feature rows ``x``."""
    return torch.round(x[..., MAX_WORKERS] * MAX_WORKERS).long()


def greedy_count(model: ActorCritic, x: torch.Tensor, cand: torch.Tensor) -> int:
    """The most likely ``C`` for one state."""
    with torch.no_grad():
        logits, _ = model(x, cand)
    return int(masked_logits(logits, sizes_of(x)).argmax()) + 1


def actor_critic_loss(model: ActorCritic, x: torch.Tensor, cand: torch.Tensor,
                      counts: torch.Tensor,
                      rewards: torch.Tensor, entropy_beta: float = ENTROPY_BETA,
                      normalize: bool = False) -> torch.Tensor:
    """Advantage actor-critic loss of a batch: states ``x`` with ``cand``, actions ``counts`` (1-based),
    returns ``rewards`` (discount 0: the return is the reward). With ``normalize``, the
    actor's advantages are scaled to zero mean and unit spread over the batch."""
    logits, values = model(x, cand)
    log_probs = torch.log_softmax(masked_logits(logits, sizes_of(x)), dim=-1)
    chosen = log_probs.gather(-1, (counts - 1).unsqueeze(-1)).squeeze(-1)
    advantage = rewards - values
    weight = advantage.detach()
    if normalize:
        weight = (weight - weight.mean()) / (weight.std() + 1e-8)
    probs = log_probs.exp()
    entropy = -(probs * log_probs.nan_to_num(neginf=0.0)).sum(-1)
    return (-(chosen * weight).mean() + 0.5 * advantage.pow(2).mean()
            - entropy_beta * entropy.mean())


def load(path: pathlib.Path = WEIGHTS) -> ActorCritic:
    """The model with the weights in ``path`` (default: the shipped ones), in eval mode."""
    model = ActorCritic()
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


class LearnedPolicy:
    """The controller's learned policy: ``choose`` a plan from measured times; with
    ``online``, each call first learns from the reward of its previous choice under the
    newly measured times."""

    def __init__(self, model: Optional[ActorCritic] = None, online: bool = True,
                 traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY, lr: float = ONLINE_LR):
        self.model = model if model is not None else load()
        self.online = online
        self.traffic_penalty = traffic_penalty
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr) if online else None
        self.last: Optional[Tuple[torch.Tensor, torch.Tensor, int]] = None

    def choose(self, times: Sequence[float], plan: Communities,
               loss_slope: float = 0.0) -> Communities:
        """Sort-and-cut of ``times`` into the ``C`` the model picks, given the current
        ``plan``."""
        if len(times) > MAX_WORKERS:
            return casp_scoring.choose(times, self.traffic_penalty)
        times = relative(times)
        if self.online and self.last is not None:
            self._learn(times)
        x = features(times, len(plan), casp_timing.mean_staleness(times, plan), loss_slope)
        cand = candidates(times)
        count = greedy_count(self.model, x, cand)
        self.last = (x, cand, count)
        return sort_and_cut(times, count)

    def _learn(self, times: Sequence[float]) -> None:
        x, cand, count = self.last
        reward = gain(times, count, self.traffic_penalty)
        loss = actor_critic_loss(self.model, x.unsqueeze(0), cand.unsqueeze(0),
                                 torch.tensor([count]), torch.tensor([reward]))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
