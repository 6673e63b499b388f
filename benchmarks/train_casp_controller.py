"""Train and evaluate the learned CASP community controller (``ripples.ps.learned_controller``).

Training is A3C: ``--actors`` threads share one ``ActorCritic``; each keeps a local copy,
plays rollouts of ``--rollout`` regroup decisions on random speed mixes in the analytic
timing model (``ripples.ps.casp_timing``), and applies its gradients to the shared model
under a light lock (the lock only covers the optimizer step, not the rollouts). Speeds
drift a little between decisions; the current ``C`` in the state is the previous action.
The actor's advantages are normalized over each rollout, and the reward is taken as a gain
over one community (``learned_controller.gain``). The threads interleave as the scheduler
lets them, so two trainings differ; ``--evaluate`` of given weights is deterministic.

Training mixes: 2..16 workers, either a few speed classes (slowdowns drawn in [1.2, 6]),
a few slow workers among normal ones, uniform slowdowns in [1, 4], or log-uniform ones
(``exp(U(0, s))``, ``s`` in [0.1, 2]), with a little noise.
The held-out mixes of ``--evaluate`` are none of these: 8 workers with speeds
{1,1,1,1,1/3,1/3,1/3,1/3}, 8 workers with one exactly 3x slow, and lognormal times.

    python benchmarks/train_casp_controller.py                # 130 s; writes the shipped weights
    python benchmarks/train_casp_controller.py --evaluate        # table + results JSON
    python benchmarks/train_casp_controller.py --evaluate --json /tmp/casp.json   # elsewhere
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import threading
import time

import torch

from ripples.ps import casp, casp_timing
from ripples.ps import learned_controller as lc

RESULTS = pathlib.Path(__file__).parent / "results" / "casp_controller.json"
LOGNORMAL_SIGMA = 0.5
LOGNORMAL_MIXES = 20
MATCH = 1 - 1e-6  # a learned reward at least this fraction of choose()'s is a match


def training_mix(rng: random.Random) -> list:
    """Worker times (fastest about 1) of one random training cluster."""
    n = rng.randint(2, lc.MAX_WORKERS)
    kind = rng.choice(("classes", "few_slow", "uniform", "log_uniform"))
    if kind == "classes":
        slowdowns = [1.0] + [rng.uniform(1.2, 6.0) for _ in range(rng.randint(1, 3))]
        times = [rng.choice(slowdowns) for _ in range(n)]
    elif kind == "few_slow":
        times = [1.0] * n
        for w in rng.sample(range(n), rng.randint(1, max(1, n // 4))):
            times[w] = rng.uniform(1.2, 6.0)
    elif kind == "uniform":
        times = [rng.uniform(1.0, 4.0) for _ in range(n)]
    else:
        spread = rng.uniform(0.1, 2.0)
        times = [math.exp(rng.uniform(0, spread)) for _ in range(n)]
    return [t * math.exp(rng.gauss(0, 0.03)) for t in times]


def held_out_mixes(seed: int = 0) -> dict:
    """The evaluation mixes: name -> list of worker times."""
    rng = random.Random(seed)
    mixes = {"classes_1_1/3": [1.0] * 4 + [3.0] * 4, "one_3x_slow": [1.0] * 7 + [3.0]}
    for i in range(LOGNORMAL_MIXES):
        mixes[f"lognormal_{i}"] = [math.exp(rng.gauss(0, LOGNORMAL_SIGMA)) for _ in range(8)]
    return mixes


def evaluate(model: lc.ActorCritic, seed: int = 0) -> dict:
    """Learned vs ``casp.choose()`` on the held-out mixes, in the timing model; the learned
    policy decides from the state of a fresh run (one community, no staleness)."""
    rows = {}
    for name, times in held_out_mixes(seed).items():
        times = lc.relative(times)
        count = lc.greedy_count(model, lc.features(times, 1, 0.0), lc.candidates(times))
        learned = casp_timing.count_reward(times, count)
        chosen = casp.choose(times)
        baseline = casp_timing.reward(times, chosen)
        best = max(casp_timing.count_reward(times, c) for c in range(1, len(times) + 1))
        rows[name] = {"times": [round(t, 4) for t in times], "learned_C": count,
                      "learned_plan": [list(c) for c in casp.sort_and_cut(times, count)],
                      "choose_C": len(chosen), "learned_reward": learned,
                      "choose_reward": baseline, "best_reward": best,
                      "ratio": learned / baseline}
    return rows


def summary(rows: dict) -> dict:
    lognormal = [r["ratio"] for name, r in rows.items() if name.startswith("lognormal")]
    return {"classes_1_1/3": rows["classes_1_1/3"]["ratio"],
            "one_3x_slow": rows["one_3x_slow"]["ratio"],
            "lognormal_mean": sum(lognormal) / len(lognormal), "lognormal_min": min(lognormal),
            "lognormal_matched_or_better": sum(r >= MATCH for r in lognormal),
            "lognormal_mixes": len(lognormal)}


def actor(shared, optimizer, lock, seed, deadline, args, counter):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    local = lc.ActorCritic()
    while time.monotonic() < deadline:
        local.load_state_dict(shared.state_dict())
        times = training_mix(rng)
        count = rng.randint(1, len(times))
        xs, cands, actions, rewards = [], [], [], []
        for _ in range(args.rollout):
            times = [t * math.exp(rng.gauss(0, 0.02)) for t in times]
            rel = lc.relative(times)
            plan = casp.sort_and_cut(rel, count)
            x = lc.features(rel, count, casp_timing.mean_staleness(rel, plan),
                            rng.uniform(-1, 0))
            cand = lc.candidates(rel)
            with torch.no_grad():
                logits, _ = local(x, cand)
            probs = torch.softmax(lc.masked_logits(logits, lc.sizes_of(x)), -1)
            count = int(torch.multinomial(probs, 1)) + 1
            xs.append(x)
            cands.append(cand)
            actions.append(count)
            rewards.append(lc.gain(rel, count))
        loss = lc.actor_critic_loss(local, torch.stack(xs), torch.stack(cands),
                                    torch.tensor(actions),
                                    torch.tensor(rewards), args.entropy, normalize=True)
        local.zero_grad()
        loss.backward()
        with lock:
            for mine, theirs in zip(local.parameters(), shared.parameters()):
                theirs.grad = mine.grad.clone()
            optimizer.step()
            counter[0] += len(actions)


def train(args) -> lc.ActorCritic:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    shared = lc.ActorCritic()
    optimizer = torch.optim.Adam(shared.parameters(), lr=args.lr)
    lock = threading.Lock()
    counter = [0]
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=actor, args=(shared, optimizer, lock, args.seed * 100 + i,
                                                    deadline, args, counter))
               for i in range(args.actors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"trained on {counter[0]} decisions with {args.actors} actors in {args.seconds} s")
    return shared.eval()


def print_table(rows: dict) -> None:
    print(f"{'mix':<16}{'learned C':>10}{'choose C':>10}{'learned':>10}{'choose()':>10}"
          f"{'ratio':>8}")
    for name, r in rows.items():
        print(f"{name:<16}{r['learned_C']:>10}{r['choose_C']:>10}{r['learned_reward']:>10.4f}"
              f"{r['choose_reward']:>10.4f}{r['ratio']:>8.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--evaluate", action="store_true", help="evaluate the shipped weights")
    parser.add_argument("--seconds", type=float, default=130.0)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--rollout", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--entropy", type=float, default=lc.ENTROPY_BETA)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=lc.WEIGHTS)
    parser.add_argument("--json", type=pathlib.Path, default=RESULTS,
                        help="where --evaluate writes its results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.evaluate:
        model = lc.load(args.out)
    else:
        model = train(args)
        torch.save(model.state_dict(), args.out)
        print(f"weights written to {args.out} ({args.out.stat().st_size} bytes)")
    rows = evaluate(model, args.seed)
    print_table(rows)
    result = {"summary": summary(rows), "mixes": rows, "timing_model": {
        "push_s": casp_timing.DEFAULT_PUSH_S, "pull_s": casp_timing.DEFAULT_PULL_S,
        "server_s": casp_timing.DEFAULT_SERVER_S,
        "traffic_penalty": casp.DEFAULT_TRAFFIC_PENALTY}}
    print(json.dumps(result["summary"], indent=1))
    if args.evaluate:
        # Imported here: tests load this file by path, where harness/ is not importable.
        from harness import report
        report.write_json(args.json, result)
        print(f"written {args.json}")


if __name__ == "__main__":
    main()
