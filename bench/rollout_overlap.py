"""Rollout overlap: 64 multi-turn rollouts whose every tool call sleeps 1 s.

    python bench/rollout_overlap.py [--rollouts 64] [--turns 4] [--tool-seconds 1] [--pool 2] [--repeats 3] [--write]

One process, side by side:
- ours: the trainer's `collect_rollouts` (one thread per rollout, generation batched by
  BatchingEngine), every rollout in flight at once; `--repeats` runs, the median reported;
- ideal: generation time (the summed wall time of the batched engine calls, measured in
  this run) + the longest tool chain (turns x tool seconds);
- 2-worker tool pool (upstream's setting): the same loop, tool calls limited to 2 at a time.

Policy: a tiny random Llama (constrained decoding, so every turn is a valid call);
each task offers only `enhance_reasoning`, so every rollout makes exactly `--turns`
calls.  The expert "thinks" for `--tool-seconds` (a sleep), the sandbox returns at once.
--write puts the table into the "Training" section of docs/benchmarks.md (bench/_report.py).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _report import load, machine, write_section  # noqa: E402

from orchestrator.catalog import load_catalog  # noqa: E402
from orchestrator.context import Budgets  # noqa: E402
from orchestrator.loop import LoopConfig, Task, task_catalog  # noqa: E402
from orchestrator.records import LLMResponse, Usage  # noqa: E402
from orchestrator.settings import load_profile  # noqa: E402
from orchestrator.setup import build_runtime  # noqa: E402
from orchestrator.toolcall import allowed_call_strings  # noqa: E402

# two code aliases of tools.json, as the catalog maps them
TOOLS = {"enhance_reasoning": {a: s.model for a, s in load_catalog().tool("enhance_reasoning").aliases.items()
                              if a in ("reasoner-1", "reasoner-2")}}


class TimedEngine:
    """Wraps an engine; sums the wall seconds of its generate calls (its busy time)."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.busy, self.calls = engine, engine.tokenizer, 0.0, 0

    def generate(self, prompts, params, *, seeds=None):
        started = time.monotonic()
        try:
            return self.engine.generate(prompts, params, seeds=seeds)
        finally:
            self.busy += time.monotonic() - started
            self.calls += 1

    def update_weights(self, weights):
        self.engine.update_weights(weights)


def tiny_engine(folder: Path):
    import json

    from orchestrator.engines import make_engine
    from orchestrator.engines.batcher import BatchingEngine
    from training.tiny_policy import build_tiny_policy, tiny_tokenizer
    catalog = task_catalog(load_catalog(), Task("x", "q", tools=TOOLS))
    texts = [json.dumps(catalog.openai_tools(tools=catalog.tools))] * 5
    texts += allowed_call_strings({t: list(a) for t, a in TOOLS.items()}) * 50
    texts += [(ROOT / "orchestrator/prompts" / f).read_text() * 5 for f in ("system.txt", "user.txt")]
    path = build_tiny_policy(folder, tiny_tokenizer(texts, vocab_size=1200), hidden=64, layers=2)
    timed = TimedEngine(make_engine("hf", str(path), device="cpu", max_batch=64))
    return timed, BatchingEngine(timed, max_batch=64)


def runtime(tool_seconds: float, pool: int | None):
    gate = threading.Semaphore(pool) if pool else None

    def llm(model, messages, **kw):
        if gate:
            with gate:
                time.sleep(tool_seconds)
        else:
            time.sleep(tool_seconds)
        return LLMResponse(model=model, text="```python\nprint(1)\n```", usage=Usage(100, 10))

    def run_code(code, timeout):
        return SimpleNamespace(stdout="1\n", stderr="", exit_code=0, timed_out=False, duration_s=0.0)
    profile = load_profile("default")
    return build_runtime(profile, {"qa": profile.section("qa", "train")}, load_catalog(), llm=llm, run_code=run_code)


def measure(engine, timed, rt, args, step: int) -> dict:
    from training.rollouts import collect_rollouts

    tasks = [Task(f"t{i}", f"Compute item {i}.", answer="1", tools=TOOLS) for i in range(args.rollouts)]
    loop = LoopConfig(max_turns=args.turns, temperature=1.0, max_tokens=48, constrained=True,
                      budgets=Budgets(context_tokens=4000))
    busy0, calls0 = timed.busy, timed.calls
    started = time.monotonic()
    groups = collect_rollouts(tasks, engine, rt, loop, rollouts_per_task=1, seed=0, step=step,
                              price_model="Qwen3-8B", concurrency=args.rollouts)
    wall = time.monotonic() - started
    calls = [sum(1 for t in g[0].turns if t.expert) for g in groups]
    return {"wall": wall, "gen": timed.busy - busy0, "engine_calls": timed.calls - calls0, "calls": sum(calls),
            "max_chain": max(calls)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tool-seconds", type=float, default=1.0)
    parser.add_argument("--pool", type=int, default=2, help="tool workers of the baseline (upstream: 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of ours (median by wall / ideal); the pool runs once")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on a busy shared CPU, 2 threads wait on each other, ~18x slower)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = load()
    with tempfile.TemporaryDirectory() as tmp:
        timed, engine = tiny_engine(Path(tmp) / "policy")
        measure(engine, timed, runtime(0.0, None), argparse.Namespace(**{**vars(args), "rollouts": 4}), 0)  # warm-up
        runs = [measure(engine, timed, runtime(args.tool_seconds, None), args, 1 + k) for k in range(args.repeats)]
        pooled = measure(engine, timed, runtime(args.tool_seconds, args.pool), args, 1 + args.repeats)
        engine.close()
    for r in [*runs, pooled]:
        r["ideal"] = r["gen"] + r["max_chain"] * args.tool_seconds
    ours = sorted(runs, key=lambda r: r["wall"] / r["ideal"])[len(runs) // 2]
    table = ["| setting | wall s | generation s (engine busy) | engine calls | tool calls | longest chain | "
             "ideal s | wall / ideal | wall / ours |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [(f"ours, run {k + 1} of {len(runs)}{' (median)' if r is ours else ''}", r) for k, r in enumerate(runs)]
    rows.append((f"{args.pool}-worker tool pool (upstream's setting)", pooled))
    for name, r in rows:
        table.append(f"| {name} | {r['wall']:.1f} | {r['gen']:.1f} | {r['engine_calls']} | {r['calls']} | "
                     f"{r['max_chain']} | {r['ideal']:.1f} | {r['wall'] / r['ideal']:.2f} | "
                     f"{r['wall'] / ours['wall']:.1f}x |")
    overlap, speedup = ours["wall"] / ours["ideal"], pooled["wall"] / ours["wall"]
    verdict = (f"Ours / ideal: **{overlap:.2f}x** (target <= 1.15x: {'met' if overlap <= 1.15 else 'not met'}); "
               f"{args.pool}-worker pool / ours: **{speedup:.1f}x** (target >= 3x: {'met' if speedup >= 3 else 'not met'}).")
    print("\n".join(table) + "\n\n" + verdict)
    if args.write:
        write_section("\n".join([
            "### Rollout overlap", "",
            f"{args.rollouts} rollouts of {args.turns} turns through the trainer's `collect_rollouts` "
            f"(one thread per rollout, all in flight, generation batched by `BatchingEngine`); every tool "
            f"call sleeps {args.tool_seconds:g} s (the expert), the sandbox answers at once. Policy: tiny "
            "random Llama (hidden 64, 2 layers), constrained decoding, so every turn is a valid call. "
            "Ideal = the run's engine busy time (summed wall time of the batched `generate` calls) + the "
            f"longest tool chain. The baseline is the same loop with tool calls limited to {args.pool} at a "
            "time. Targets: ours within 1.15x of ideal, >= 3x faster than the pool.", "",
            f"Machine: {machine(f'torch {torch.__version__}, {args.threads} torch thread(s)')}; shared with other workers' jobs "
            f"(1-minute load average {load_start:.1f} at the start, {load():.1f} at the end).", "",
            f"Command: `python bench/rollout_overlap.py --rollouts {args.rollouts} --turns {args.turns} "
            f"--tool-seconds {args.tool_seconds:g} --pool {args.pool} --repeats {args.repeats} --threads {args.threads} "
            "--write`", "",
            *table, "", verdict]), under="## Training")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
