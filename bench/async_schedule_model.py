"""A schedule model of asynchronous training (not a measurement): steps per hour, the share of
time the GPU works and the share of turns dropped as too stale, for `algorithm.max_staleness` and
`algorithm.async_order`, from the shapes of bench/async_rollouts.py.

    python bench/async_schedule_model.py                        # the H200 bench's shapes (below)
    python bench/async_schedule_model.py --update 1.0 --decode 0.1 --median 0.1 --p99 2 --gpu-per-step 1.2

It replays the producer's rules (training/async_rollouts.py) on drawn durations instead of running
them: batch j of `--tasks` groups starts once `j - s` updates are done; a group of `--group` rollouts
ends with its slowest rollout; a rollout takes turns of `--decode` s plus one tool call (log-normal,
median `--median`, 99th percentile `--p99`) until it answers (probability `--answer-prob` a turn) or
reaches `--turns`.  Step k starts when its groups are done (batch order: batch k's; completion order:
the `--tasks` oldest done) and the update before it has ended, and takes `--update` s; the GPU is
counted busy `--gpu-per-step` s a step (the update plus the step's decoding).  A turn is stale when
its weights are more than s updates older than the step that trains it (it would be dropped).

Not modelled: decoding slowing down with more rows in flight, the update and decoding sharing the
GPU, compile time, a batch's rollouts queueing for `rollout.concurrency` threads (all of a batch's
rollouts run at once here, as bench/async_rollouts.py sets it).  On the H200 (docs/async-training.md) the measured batch-order runs are the check on it.
"""
from __future__ import annotations

import argparse
import bisect
import math
import random
import statistics


def rollout_turns(rng: random.Random, args) -> list[float]:
    """The durations of one rollout's turns (decode + tool call)."""
    sigma = math.log(args.p99 / args.median) / 2.3263
    turns = []
    for _ in range(args.turns):
        turns.append(args.decode + rng.lognormvariate(math.log(args.median), sigma))
        if rng.random() < args.answer_prob:
            break
    return turns


def simulate(args, staleness: int, order: str, seed: int, durations=None) -> dict:
    """Rates, busy share, stale share and `taken` (each step's groups); `durations(j, i)` -> that
    group's rollouts' turn durations replaces the drawn ones (tests)."""
    rng = random.Random(seed)
    steps, B = args.steps, args.tasks
    groups = {(j, i): durations(j, i) if durations else [rollout_turns(rng, args) for _ in range(args.group)]
              for j in range(steps) for i in range(B)}
    update_ends: list[float] = []            # the time update k ended = version k + 1 from then on
    started: dict[int, float] = {}           # batch -> start time
    done: dict[tuple[int, int], float] = {}  # group -> end time
    trained: set[tuple[int, int]] = set()
    step_ends, stale, turns, taken = [], 0, 0, []

    def admit() -> None:
        for j in range(steps):
            if j not in started and j - staleness <= len(update_ends):
                at = 0.0 if j - staleness <= 0 else update_ends[j - staleness - 1]
                started[j] = at
                for i in range(B):
                    done[(j, i)] = at + max(sum(r) for r in groups[(j, i)])

    def version_at(t: float) -> int:
        return bisect.bisect_right(update_ends, t)

    clock = 0.0
    for k in range(steps):
        admit()
        if order == "batch":
            take = [(k, i) for i in range(B)]
        else:
            waiting = sorted((g for g in done if g not in trained), key=lambda g: done[g])
            ready_at = max(clock, done[waiting[B - 1]])
            take = sorted(g for g in waiting if done[g] <= ready_at)[:B]
        start = max(clock, max(done[g] for g in take))
        for g in take:
            for r in groups[g]:
                t = started[g[0]]
                for d in r:                        # each turn's weights: the version when it started
                    stale += k - version_at(t) > staleness
                    turns += 1
                    t += d
        trained.update(take)
        taken.append(take)
        clock = start + args.update
        update_ends.append(clock)
        step_ends.append(clock)
    warm = args.warmup
    wall = step_ends[-1] - step_ends[warm - 1]
    counted = steps - warm
    return {"steps_per_hour": 3600 * counted / wall, "gpu_busy": min(1.0, counted * args.gpu_per_step / wall),
            "stale_turns": stale / turns, "taken": taken}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--answer-prob", type=float, default=0.2)
    p.add_argument("--median", type=float, default=1.0)
    p.add_argument("--p99", type=float, default=20.0)
    p.add_argument("--decode", type=float, default=0.8, help="seconds a turn decodes (64 tokens at ~12 ms)")
    p.add_argument("--update", type=float, default=10.0, help="seconds an update takes (H200: 8-10)")
    p.add_argument("--gpu-per-step", type=float, default=12.0, help="GPU-busy seconds a step (H200: ~12)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the rates")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 3])
    args = p.parse_args()
    print("| max_staleness | order | steps / h | vs synchronous | GPU busy | turns over the bound |")
    print("|---:|---|---:|---:|---:|---:|")
    base = None
    for s in args.staleness:
        for order in (("batch",) if s == 0 else ("batch", "completion")):
            runs = [simulate(args, s, order, seed) for seed in range(args.seeds)]
            rate = statistics.mean(r["steps_per_hour"] for r in runs)
            spread = statistics.pstdev(r["steps_per_hour"] for r in runs)
            base = base or rate
            print(f"| {s} | {order if s else '-'} | {rate:.0f} +/- {spread:.0f} | {rate / base:.2f}x | "
                  f"{statistics.mean(r['gpu_busy'] for r in runs):.0%} | "
                  f"{statistics.mean(r['stale_turns'] for r in runs):.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
