"""Multi-turn rollout scheduling against its floor, on the CPU: the real `collect_rollouts` +
`BatchingEngine` (threads, 1 s tool sleeps) over an engine that sleeps what the H200's static
decoder takes for each call.

    python bench/rollout_schedule.py                       # 128 rollouts x 8 turns, max_batch 32, linger 0 vs 250 ms
    python bench/rollout_schedule.py --linger-ms 0 20 50 100 --repeats 3

Everything but the GPU is real: one thread per rollout, the episode loop and its prompts
(bench/gpu_rollouts.py's tokenizer, tool calls and `ScriptedCalls`), the expert's 1 s sleep, the
BatchingEngine and its worker thread.  The engine (`ModelledEngine`) splits a call into
`max_batch` chunks as HFEngine does and sleeps, per chunk, what the static decoder
(orchestrator/engines/hf_static.py) costs for it on one H200 for the Qwen3-0.6B body
(docs/history.md, "GPU: rollout decode" and its "new shapes" table, 64 rows, 64 new tokens):

    seconds = a(rows, width) + steps x b(rows) [+ CAPTURE_S when (rows, cache length) is not one
              of the decoder's 2 kept shapes]
    rows  = the static shape's rows (the call's rows rounded up to a power of two, <= max_batch)
    steps = the longest row's length rounded up to the decoder's EOS check (every 16 steps),
            at most max_tokens: rows that end early keep decoding until the longest has
    b(rows) = 1.65 ms + rows x 11.4 us   per decode step: 2.38 ms at 64 rows (run G); the
            per-row part is the attention (0.61 ms) and sampling (0.12 ms) at 64 rows
    a(rows, width) = max(5 ms, rows x (7.85 us x width - 0.505 ms))   the prefill and the call's
            host work: fitted to the table's second calls at widths 128 / 384 / 896 (0.184 /
            0.309 / 0.570 s) less 64 steps x 2.38 ms (fits within 0.01 s)
    CAPTURE_S = 0.16 s: a new shape's CUDA-graph captures (width 896's first call, 0.73 s, less
            its second, 0.57 s; the compile is dynamic by then)

Rows end at drawn lengths (bench/gpu_grpo_e2e.py's `ForcedLengths` draws: geometric, median 0.4 x
`--tokens`, capped).  Per setting of `--linger-ms` (`BatchingEngine(linger_ms=)`, train.py's
`engine.linger_ms`) `--repeats` runs; each reports wall, the floor of bench/gpu_rollouts.py
(`measure`: each turn's recorded prompts generated again alone through the same modelled engine),
wall / floor (target <= 1.2x), the first turn's queue (`first_turn_queue`: its 4 chunks run one
after another, which the floor leaves out) and the engine calls (8 x 128 / 32 = 32 full ones).
`--max-batch 128 --lengths cap --linger-ms 0` replays the H200 run of docs/benchmarks.md (rows to
the cap, the bench's max_batch then) as a check of the model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_grpo_e2e import ForcedLengths  # noqa: E402
from gpu_rollouts import ScriptedCalls, measure, policy_tokenizer, workload_args  # noqa: E402
from rollout_overlap import TimedEngine  # noqa: E402

from orchestrator.engines.interface import Generation  # noqa: E402
from orchestrator.engines.batcher import BatchingEngine  # noqa: E402
from orchestrator.engines.hf_static import static_shape  # noqa: E402
from orchestrator.toolcall import format_tool_call  # noqa: E402

CHECK_EVERY, KEPT_SHAPES, CAPTURE_S = 16, 2, 0.16


def step_seconds(rows: int) -> float:
    return 1.65e-3 + rows * 11.4e-6


def call_seconds(rows: int, width: int) -> float:
    return max(5e-3, rows * (7.85e-6 * width - 0.505e-3))


class ModelledEngine:
    """An engine whose generate call sleeps the static decoder's H200 time for it (module
    docstring); each row ends with EOS at its drawn length."""

    def __init__(self, tokenizer, max_batch: int, cap: int, median_frac: float | None):
        self.tokenizer, self.max_batch, self.cap = tokenizer, max_batch, cap
        self.lengths = ForcedLengths(max_batch, cap, median_frac, "cpu") if median_frac else None
        self.shapes: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.chunks: list[int] = []              # rows of every chunk served

    def generate(self, prompts, params, *, seeds=None):
        out = []
        for start in range(0, len(prompts), self.max_batch):
            out += self._chunk(prompts[start:start + self.max_batch], params)
        return out

    def _chunk(self, prompts, params):
        n, width = len(prompts), max(len(p) for p in prompts)
        shape = static_shape(n, width, params.max_tokens, self.max_batch)
        seconds = 0.0
        if shape in self.shapes:
            self.shapes.move_to_end(shape)
        else:
            seconds += CAPTURE_S
            self.shapes[shape] = None
            while len(self.shapes) > KEPT_SHAPES:
                self.shapes.popitem(last=False)
        lengths = ([min(params.max_tokens, x) for x in self.lengths.draw(len(self.chunks), n)] if self.lengths
                   else [params.max_tokens] * n)
        steps = min(params.max_tokens, -(-max(lengths) // CHECK_EVERY) * CHECK_EVERY)
        rows = shape[0]
        seconds += call_seconds(rows, width) + steps * step_seconds(rows)
        self.chunks.append(n)
        time.sleep(seconds)
        eos = self.tokenizer.eos_token_id
        return [Generation(token_ids=[eos] * k, logprobs=[0.0] * k, text="",
                           finish_reason="stop" if k < params.max_tokens else "length") for k in lengths]

    def update_weights(self, weights):
        pass


def run_setting(args, tok, linger_ms: float) -> dict:
    modelled = ModelledEngine(tok, args.max_batch, args.tokens, args.median_frac if args.lengths == "geometric" else None)
    timed = TimedEngine(modelled)
    scripted = ScriptedCalls(timed, format_tool_call("enhance_reasoning", {"model": "reasoner-1"}))
    engine = BatchingEngine(scripted, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, linger_ms=linger_ms)
    runs = []
    try:
        for k in range(args.repeats):
            first = len(modelled.chunks)
            r = measure(engine, timed, scripted, args, args.tool_seconds, 1 + k)
            calls = modelled.chunks[first:first + r["engine_calls"]]
            r["rows_per_call"] = {str(size): calls.count(size) for size in sorted(set(calls))}
            del r["full_batch_turn_s"]
            runs.append(r)
            print(f"linger {linger_ms:g} ms, run {k + 1}: wall {r['wall']:.2f} s, floor {r['floor']:.2f} s (+ first-turn "
                  f"queue {r['first_turn_queue']:.2f} s), wall / floor {r['wall_over_floor']:.2f}x, engine calls {r['engine_calls']}, busy {r['gen']:.2f} s, "
                  f"rows per call {r['rows_per_call']}", flush=True)
    finally:
        engine.close()
    return {"linger_ms": linger_ms, "runs": runs,
            "median_wall_over_floor": statistics.median(r["wall_over_floor"] for r in runs),
            "median_engine_calls": statistics.median(r["engine_calls"] for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(parser, repeats=3)
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="BatchingEngine(max_wait_ms=)")
    args = parser.parse_args()
    tok = policy_tokenizer()
    results = {"args": vars(args) | {"json": str(args.json)}, "settings": []}
    for linger in args.linger_ms:
        results["settings"].append(run_setting(args, tok, linger))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print("\n| linger_ms | wall s | floor s | first-turn queue s | wall / floor | wall / (floor + queue) | engine calls "
          "| engine busy s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in results["settings"]:
        for r in s["runs"]:
            print(f"| {s['linger_ms']:g} | {r['wall']:.2f} | {r['floor']:.2f} | {r['first_turn_queue']:.2f} | "
                  f"{r['wall_over_floor']:.2f} | {r['wall_over_floor_and_queue']:.2f} | {r['engine_calls']} | {r['gen']:.2f} |")
    for s in results["settings"]:
        verdict = "met" if s["median_wall_over_floor"] <= 1.2 else "not met"
        print(f"linger {s['linger_ms']:g} ms: median wall / floor {s['median_wall_over_floor']:.2f}x "
              f"(target <= 1.2x: {verdict}), median engine calls {s['median_engine_calls']:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
