"""How far the rollout engine's log-probs are from the trainer's, per precision.

    python bench/logprob_gap.py [--rows 8 --tokens 48] [--write]

SmolLM2-135M-Instruct (the embedded model, real weights) samples `--rows` completions of
chat prompts at T = 1 through `HFEngine`; the trainer's `response_logprobs` (what PPO's ratio
and the KL use) then scores the same tokens.  Reported: mean and max |engine - trainer| per
token, and the mean of exp(trainer - engine) - 1 (the PPO ratio's offset from 1 that
`algorithm.old_logprobs: engine` would start the update with).  Paths:
  float32             float32 weights, engine and trainer (model.dtype float32)
  bf16 shared, loop   float32 master weights under bf16 autocast, the engine's step-by-step
                      loop under the same autocast (model.dtype bfloat16 on a CPU)
  bf16 shared, static the engine's static decoder over its bf16 copy of the weights
                      (model.dtype bfloat16 on a GPU: `decode="auto"`; forced here)
  bf16 separate       a separate engine holding bf16 weights, as vLLM or a Ray engine actor
                      does (the same arithmetic as the static copy, the loop's code)
The trainer always runs float32 weights under autocast for bf16.  CPU; numbers depend on
the model, not the machine.
--write puts the table into the "Training" section of docs/benchmarks.md (bench/_report.py).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _report import machine, write_section  # noqa: E402

PROMPTS = ["What is the capital of France?", "Name three colours.", "Why is the sky blue?", "Write a haiku.",
           "How do I boil an egg?", "What is 12 times 7?", "Describe a cat.", "Say something kind."]


def gap(engine, model, tok, precision, rows: int, tokens: int) -> dict:
    from orchestrator.engines.interface import SamplingParams
    from training.samples import TurnSample, collate_samples
    from training.ppo import response_logprobs

    prompts = [tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
               for i in range(rows)]
    gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=0))
    samples = [TurnSample(p, g.token_ids, [1] * len(g.token_ids), None, 0.0, str(i), 0)
               for i, (p, g) in enumerate(zip(prompts, gens)) if g.token_ids]
    batch = collate_samples(samples, tok.pad_token_id or 0)
    with torch.no_grad(), precision.autocast("cpu"):
        trainer = response_logprobs(model, batch, 1.0)
    diffs, ratios = [], []
    for row, (s, g) in enumerate(zip(samples, [g for g in gens if g.token_ids])):
        start = len(s.prompt_ids)
        t = trainer[row, start:start + len(g.token_ids)]
        e = torch.tensor(g.logprobs)
        diffs.append((e - t).abs())
        ratios.append(torch.exp(t - e) - 1)
    d, r = torch.cat(diffs), torch.cat(ratios)
    return {"tokens": int(d.numel()), "mean_abs": float(d.mean()), "max_abs": float(d.max()),
            "ratio_offset": float(r.mean()), "ratio_offset_abs": float(r.abs().mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from orchestrator.engines.hf import HFEngine
    from training.precision import Precision

    path = smollm2_path()
    tok = AutoTokenizer.from_pretrained(path)
    fp32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    bf16 = copy.deepcopy(fp32)
    for p in bf16.parameters():
        p.data = p.data.to(torch.bfloat16)
    f32, b16 = Precision.of("float32"), Precision.of("bfloat16")
    runs = {
        "float32": (HFEngine(fp32, tok, device="cpu", decode="eager"), f32),
        "bf16 shared, loop": (HFEngine(fp32, tok, device="cpu", decode="eager", compute_dtype=torch.bfloat16), b16),
        "bf16 shared, static": (HFEngine(fp32, tok, device="cpu", decode="static", compute_dtype=torch.bfloat16), b16),
        "bf16 separate": (HFEngine(bf16, tok, device="cpu", decode="eager"), b16),
    }
    rows = []
    for name, (engine, precision) in runs.items():
        r = gap(engine, fp32, tok, precision, args.rows, args.tokens)
        rows.append(f"| {name} | {r['tokens']} | {r['mean_abs']:.4f} | {r['max_abs']:.3f} | "
                    f"{r['ratio_offset']:+.4f} | {r['ratio_offset_abs']:.4f} |")
        print(rows[-1], flush=True)
    table = ["| engine path | tokens | mean abs gap | max abs gap | mean (ratio - 1) | mean abs (ratio - 1) |",
             "|---|---:|---:|---:|---:|---:|", *rows]
    if args.write:
        write_section("\n".join([
            "### Rollout log-probs vs the trainer's", "",
            "How far the engine's sampled-token log-probs are from what the trainer's `response_logprobs` "
            f"computes for the same tokens (SmolLM2-135M-Instruct, real weights, {args.rows} chat prompts, up to "
            f"{args.tokens} tokens at T = 1). The trainer runs float32 weights, under bf16 autocast for the bf16 "
            "rows. ratio = exp(trainer - engine): what PPO's ratio would start at with "
            "`algorithm.old_logprobs: engine` (the default, recompute, starts at exactly 1).", "",
            f"Machine: {machine(f'torch {torch.__version__}')}.", "",
            f"Command: `python bench/logprob_gap.py --rows {args.rows} --tokens {args.tokens} --write`", "",
            *table]), under="## Training")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
