"""Multi-turn rollouts on a GPU: `collect_rollouts` + the static decoder, every tool call 1 s.

    python bench/gpu_rollouts.py                       # on a GPU: 128 rollouts x 8 turns, Qwen3-0.6B body
    python bench/gpu_rollouts.py --tiny --device cpu --rollouts 4 --turns 2 --tool-seconds 0.2

The trainer's `collect_rollouts` (one thread per rollout, all in flight, generation batched by
`BatchingEngine`) drives `HFEngine` as train.py builds it for model.dtype bfloat16 (float32
weights + compute dtype bfloat16, decoded by the static decoder: static KV cache, compiled
forward, CUDA graphs).  Model: the Qwen3-0.6B body (28 layers, hidden 1024, 16 / 8 heads) with
random weights and the vocabulary of a small BPE tokenizer trained on the prompts and tool
calls (as bench/rollout_overlap.py's tiny policy).  Random weights write no tool call, so each
turn decodes `--tokens` tokens through the engine (the decode cost is real: rows never sample
EOS) and the text the episode receives is then replaced by a valid `enhance_reasoning` call
(`ScriptedCalls`): every rollout makes `--turns` calls, each answered after `--tool-seconds`
by the (sleeping) expert; prompts grow turn by turn as in a real episode.
Two references for the wall time.  `ideal` (the old one) = the engine's busy time (summed wall
time of its batched generate calls) + the longest tool chain: about what a lockstep schedule
with no overlap takes, so not a floor.  `floor`: after each measured run, each turn t's
recorded prompts are generated again, all rollouts in one engine call that the engine serves in
chunks of `--max-batch` rows (the trainer's engine.max_batch, 32 by default), timed alone: T_t
over c_t chunks.  Every rollout waits, each turn, at least for one chunk (T_t / c_t) and its tool
call, and the engine must do all the turns' work one chunk after another, so
floor = max(sum_t (tool seconds + T_t / c_t), sum_t T_t): with one chunk per turn, the issue's
turns x (tool latency + one full-batch turn).  Target: wall <= 1.2x floor.  Beside it `first_turn_queue` = (c_1 - 1) x T_1 / c_1: the first
turn's chunks run one after another, so the last chunk's rollouts start that much later (no
schedule of max_batch-row calls avoids it; the floor leaves it out).
`--lengths geometric` (the default) ends each row at a drawn length (forced EOS, median 0.4 x
`--tokens`, bench/gpu_grpo_e2e.py's `ForcedLengths`) instead of running every row to `--tokens`.
A first run with no tool latency, then one call of 8 rows and one of 1, warm the compiler and
CUDA graphs (reported apart);
`--repeats` runs are measured per `--linger-ms` setting (`BatchingEngine(linger_ms=)`, train.py's
`engine.linger_ms`: how long a short batch waits for episodes coming back from their tools; 0 is
the old policy).  Progress is printed per run and the JSON rewritten after each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rollout_overlap import TOOLS, TimedEngine, runtime

from orchestrator.catalog import load_catalog
from orchestrator.context import Budgets
from orchestrator.engines.interface import Generation
from orchestrator.loop import LoopConfig, Task, task_catalog
from orchestrator.toolcall import allowed_call_strings, format_tool_call


class ScriptedCalls:
    """Runs the real engine call (its decode cost), then hands back one valid tool call per row
    as the generated text (a random-weight policy writes none)."""

    def __init__(self, engine, call_text: str):
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.call_ids = engine.tokenizer(call_text, add_special_tokens=False)["input_ids"]
        self.call_text = call_text
        self.decoded = 0

    def generate(self, prompts, params, *, seeds=None):
        real = self.engine.generate(prompts, params, seeds=seeds)
        self.decoded += sum(len(g.token_ids) for g in real)
        return [Generation(token_ids=list(self.call_ids), logprobs=[0.0] * len(self.call_ids), text=self.call_text)
                for _ in real]

    def update_weights(self, weights):
        self.engine.update_weights(weights)


def policy_tokenizer():
    """A small BPE tokenizer (1,200 tokens) trained on the prompts and tool calls."""
    from training.tiny_policy import tiny_tokenizer

    catalog = task_catalog(load_catalog(), Task("x", "q", tools=TOOLS))
    texts = [json.dumps(catalog.openai_tools(tools=catalog.tools))] * 5
    texts += allowed_call_strings({t: list(a) for t, a in TOOLS.items()}) * 50
    texts += [(ROOT / "orchestrator/prompts" / f).read_text() * 5 for f in ("system.txt", "user.txt")]
    return tiny_tokenizer(texts, vocab_size=1200)


def build_engine(args, device: torch.device):
    """(TimedEngine over the HFEngine, ScriptedCalls over that); wrap the latter in a BatchingEngine."""
    from gpu_train_step import qwen3_config
    from transformers import Qwen3ForCausalLM

    from orchestrator.engines import make_engine

    tok = policy_tokenizer()
    cfg = qwen3_config(args.tiny)
    cfg.vocab_size, cfg.eos_token_id, cfg.pad_token_id = len(tok), tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).float().eval()          # train.py's model.dtype bfloat16: float32 weights
    forced = None
    if args.lengths == "geometric":
        from gpu_grpo_e2e import ForcedLengths, force_lengths

        forced = ForcedLengths(args.max_batch, args.tokens, args.median_frac, device)
        force_lengths(model, tok.eos_token_id, forced)
    engine = make_engine("hf", model, tokenizer=tok, device=str(device), max_batch=args.max_batch,
                         compute_dtype=torch.bfloat16 if device.type == "cuda" else None,
                         decode="static" if args.static_on_cpu and device.type == "cpu" else "auto")
    timed = TimedEngine(ForcedEngine(engine, forced) if forced else engine)
    scripted = ScriptedCalls(timed, format_tool_call("enhance_reasoning", {"model": "reasoner-1"}))
    return timed, scripted


class ForcedEngine:
    """An HFEngine whose calls draw forced lengths for their rows, one max_batch chunk at a time."""

    def __init__(self, engine, forced):
        self.engine, self.forced, self.tokenizer = engine, forced, engine.tokenizer

    def generate(self, prompts, params, *, seeds=None):
        out, size = [], self.engine.max_batch
        for start in range(0, len(prompts), size):
            with self.forced.generating(len(prompts[start:start + size])):
                out += self.engine.generate(prompts[start:start + size], params,
                                            seeds=None if seeds is None else seeds[start:start + size])
        return out

    def update_weights(self, weights):
        self.engine.update_weights(weights)


def floor_turns(timed, groups, args, step: int) -> list[tuple[float, int]]:
    """Per turn: seconds to generate it for every rollout in one engine call, and the number of
    max_batch chunks that call took."""
    from orchestrator.engines.interface import SamplingParams

    seconds = []
    for t in range(args.turns):
        prompts = [list(g[0].turns[t].prompt_ids) for g in groups if len(g[0].turns) > t and g[0].turns[t].prompt_ids]
        if not prompts:
            break
        started = time.monotonic()
        timed.engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=10_000 * step + t))
        seconds.append((time.monotonic() - started, -(-len(prompts) // args.max_batch)))
    return seconds


def warm_row_counts(timed, args, width: int = 512) -> float:
    """Generate once for 8 rows and once for 1 (what split batches make: the warm-up run's calls
    are mostly full), so the timed runs of every setting find the decode forward compiled for
    any row count (torch.compile marks the dimension dynamic at its second value; 1 is
    specialised); returns the seconds taken."""
    from orchestrator.engines.interface import SamplingParams

    started = time.monotonic()
    for n in (8, 1):
        timed.engine.generate([[5] * width] * n, SamplingParams(temperature=1.0, max_tokens=args.tokens))
    return time.monotonic() - started


def measure(engine, timed, scripted, args, tool_seconds: float, step: int) -> dict:
    from training.rollouts import collect_rollouts

    tasks = [Task(f"t{i}", f"Compute item {i}.", answer="1", tools=TOOLS) for i in range(args.rollouts)]
    loop = LoopConfig(max_turns=args.turns, temperature=1.0, max_tokens=args.tokens, constrained=False,
                      budgets=Budgets(context_tokens=args.context_tokens))
    busy0, calls0, decoded0 = timed.busy, timed.calls, scripted.decoded
    started = time.monotonic()
    groups = collect_rollouts(tasks, engine, runtime(tool_seconds, None), loop, rollouts_per_task=1, seed=0, step=step,
                              price_model="Qwen3-8B", concurrency=args.rollouts)
    wall = time.monotonic() - started
    calls = [sum(1 for t in g[0].turns if t.expert) for g in groups]
    widths = [len(t.prompt_ids) for g in groups for t in g[0].turns if t.prompt_ids]
    r = {"wall": wall, "gen": timed.busy - busy0, "engine_calls": timed.calls - calls0, "calls": sum(calls),
         "max_chain": max(calls), "decoded_tokens": scripted.decoded - decoded0,
         "prompt_tokens_min_max": [min(widths), max(widths)] if widths else None}
    r["ideal"] = r["gen"] + r["max_chain"] * tool_seconds
    r["ratio"] = r["wall"] / r["ideal"]
    turns = floor_turns(timed, groups, args, step)
    r["full_batch_turn_s"] = turns
    r["floor"] = max(sum(t / c + tool_seconds for t, c in turns), sum(t for t, _ in turns))
    r["wall_over_floor"] = r["wall"] / r["floor"]
    # the first turn's chunks run one after another: the rollouts of the last one start that much
    # later, which the floor does not count and no schedule of max_batch-row calls avoids
    r["first_turn_queue"] = (turns[0][1] - 1) * turns[0][0] / turns[0][1] if turns else 0.0
    r["wall_over_floor_and_queue"] = r["wall"] / (r["floor"] + r["first_turn_queue"])
    return r


def workload_args(parser: argparse.ArgumentParser, repeats: int) -> None:
    """The rollouts, turns, lengths, max_batch and linger settings (shared with bench/rollout_schedule.py)."""
    from training.config import EngineConfig

    parser.add_argument("--rollouts", type=int, default=128)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="most tokens per turn (max_tokens)")
    parser.add_argument("--tool-seconds", type=float, default=1.0)
    parser.add_argument("--context-tokens", type=int, default=8192)
    parser.add_argument("--max-batch", type=int, default=32, help="rows per engine call (the trainer's engine.max_batch)")
    parser.add_argument("--linger-ms", type=float, nargs="+", default=[0.0, EngineConfig().linger_ms],
                        help="BatchingEngine(linger_ms=) settings, each measured --repeats times (default: 0, the "
                             "old policy, and the trainer's engine.linger_ms)")
    parser.add_argument("--lengths", choices=["geometric", "cap"], default="geometric",
                        help="turn lengths: forced EOS at geometric draws (median --median-frac x --tokens), or every row "
                             "to --tokens")
    parser.add_argument("--median-frac", type=float, default=0.4)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--json", type=Path)


def main() -> int:
    from orchestrator.engines.batcher import BatchingEngine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen3 config (checks the script)")
    parser.add_argument("--device", default="cuda")
    workload_args(parser, repeats=2)
    parser.add_argument("--static-on-cpu", action="store_true", help="decode='static' on the CPU (eager; tests the path)")
    args = parser.parse_args()
    device = torch.device(args.device)
    timed, scripted = build_engine(args, device)
    results: dict = {"args": vars(args) | {"json": str(args.json)}, "torch": torch.__version__}
    if device.type == "cuda":
        results["card"] = torch.cuda.get_device_name(device)

    def save():
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))

    started = time.monotonic()
    with BatchingEngine(scripted, max_batch=args.max_batch) as engine:
        results["warmup"] = measure(engine, timed, scripted, args, 0.0, 0)
    results["warmup_row_counts_s"] = warm_row_counts(timed, args)
    print(f"warm-up ({time.monotonic() - started:.0f} s; 8 and 1 rows: {results['warmup_row_counts_s']:.1f} s)",
          results["warmup"], flush=True)
    save()
    results["settings"], step = [], 1
    for linger in args.linger_ms:
        setting = {"linger_ms": linger, "runs": []}
        results["settings"].append(setting)
        with BatchingEngine(scripted, max_batch=args.max_batch, linger_ms=linger) as engine:
            for k in range(args.repeats):
                setting["runs"].append(measure(engine, timed, scripted, args, args.tool_seconds, step))
                step += 1
                r = setting["runs"][-1]
                print(f"linger {linger:g} ms, run {k + 1} ({time.monotonic() - started:.0f} s): wall {r['wall']:.2f} s, "
                      f"floor {r['floor']:.2f} s (+ first-turn queue {r['first_turn_queue']:.2f} s), wall / floor "
                      f"{r['wall_over_floor']:.2f}x, engine calls "
                      f"{r['engine_calls']}, busy {r['gen']:.2f} s", flush=True)
                save()
        setting["median_ratio"] = statistics.median(r["ratio"] for r in setting["runs"])
        setting["median_wall_over_floor"] = statistics.median(r["wall_over_floor"] for r in setting["runs"])
        setting["median_engine_calls"] = statistics.median(r["engine_calls"] for r in setting["runs"])
        save()
    for setting in results["settings"]:
        over = setting["median_wall_over_floor"]
        print(f"linger {setting['linger_ms']:g} ms: wall / floor (median of {args.repeats}) {over:.2f}x (target <= "
              f"1.2x: {'met' if over <= 1.2 else 'not met'}), engine calls {setting['median_engine_calls']:g}, wall / "
              f"ideal {setting['median_ratio']:.2f}x (busy + longest chain: not a floor)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
