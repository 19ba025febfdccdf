"""Rollout engines on SmolLM2-135M (fp32, CPU): start, generation speed, weight sync and its proof.

For each engine: start-up seconds; generated tokens/s at each batch size (sampling at T = 1,
median over repeats); then one weight update to perturbed weights (the policy after a step),
timed, followed by the proof: greedy tokens of the engine equal `HFEngine`'s on the same new
weights.  vLLM is measured with both weight-sync modes (in place, rebuild).

    python bench/engines.py [--tokens 32] [--batches 1 8] [--repeats 3] [--engines hf vllm] [--write]

--write puts the tables into the "Rollout engines" section of docs/benchmarks.md (other
sections kept).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import write_section

from orchestrator.embedded import smollm2_path
from orchestrator.engines.interface import SamplingParams
from orchestrator.engines import make_engine

SECTION = "## Rollout engines"
QUESTIONS = ["Write a long story about a lighthouse keeper.", "Explain how rain forms, step by step.",
             "List ten uses of a paperclip and explain each.", "Describe the history of the bicycle."]


def prompts_for(tok, n: int) -> list[list[int]]:
    texts = [tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                     add_generation_prompt=True, tokenize=False) for i in range(n)]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def perturbed_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """SmolLM2's weights plus small noise: a stand-in for the policy after an optimizer step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())
    return model.state_dict()


def throughput(engine, batches: list[int], tokens: int, repeats: int) -> dict[int, list[float]]:
    """tokens/s of each repeat, per batch size."""
    out = {}
    for b in batches:
        prompts = prompts_for(engine.tokenizer, b)
        engine.generate(prompts[:1], SamplingParams(max_tokens=4))          # warm-up
        rates = []
        for r in range(repeats):
            started = time.perf_counter()
            gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=r))
            rates.append(sum(len(g.token_ids) for g in gens) / (time.perf_counter() - started))
        out[b] = rates
    return out


def sync_and_prove(engine, new_weights, reference) -> tuple[float, bool]:
    """Seconds for update_weights, and whether greedy tokens then equal the reference engine's."""
    started = time.perf_counter()
    engine.update_weights(new_weights)
    seconds = time.perf_counter() - started
    prompts = prompts_for(engine.tokenizer, 3)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    same = [g.token_ids for g in engine.generate(prompts, greedy)] == \
           [g.token_ids for g in reference.generate(prompts, greedy)]
    return seconds, same


def measure(args) -> list[dict]:
    new = perturbed_state_dict()
    reference = make_engine("hf", smollm2_path(), device="cpu")
    reference.update_weights(new)
    rows = []
    for kind in args.engines:
        started = time.perf_counter()
        engine = make_engine(kind, smollm2_path(), **({"max_model_len": 2048} if kind == "vllm" else {"device": "cpu"}))
        start_s = time.perf_counter() - started
        rates = throughput(engine, args.batches, args.tokens, args.repeats)
        modes = ["inplace", "rebuild"] if kind == "vllm" else ["inplace"]
        for mode in modes:
            if kind == "vllm":
                engine.weight_sync = mode
            sync_s, same = sync_and_prove(engine, new, reference)
            rows.append({"engine": kind, "start_s": start_s, "rates": rates, "sync": mode,
                         "sync_s": sync_s, "same": same})
            engine.update_weights(str(smollm2_path()))                        # back to the original
        if hasattr(engine, "close"):
            engine.close()
        print(rows[-len(modes):], flush=True)
    return rows


def table(rows: list[dict], args) -> str:
    batches = args.batches
    head = "| engine | start s | " + " | ".join(f"tok/s @ batch {b} (median)" for b in batches) + \
           " | weight sync | sync s | greedy = transformers on new weights |"
    lines = [SECTION, "",
             "SmolLM2-135M-Instruct in float32; sampling at T = 1 with up to "
             f"{args.tokens} new tokens per prompt (EOS may end a row earlier; tokens counted are those generated); "
             f"median of {args.repeats} repeats after a warm-up. Weight sync: `update_weights` with the "
             "model's weights plus noise (0.05 x each tensor's std), then 24 greedy tokens on 3 prompts "
             "compared with `HFEngine` holding the same weights.", "",
             f"Machine: 2-core CPU, 24 GiB ({platform.python_version()}, torch {torch.__version__}); shared with "
             f"other workers' jobs during the run (load average {os.getloadavg()[0]:.1f} at the end), so absolute "
             "numbers are noisy.", "",
             f"Command: `python bench/engines.py --tokens {args.tokens} --batches {' '.join(map(str, batches))} "
             f"--repeats {args.repeats} --engines {' '.join(args.engines)} --write`", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        rates = " | ".join(f"{statistics.median(r['rates'][b]):.1f}" for b in batches)
        lines.append(f"| {r['engine']} | {r['start_s']:.1f} | {rates} | {r['sync']} | {r['sync_s']:.2f} | "
                     f"{'yes' if r['same'] else 'NO'} |")
    lines += ["", "vLLM runs in-process on CPU (`in_process=True`); its in-place sync is `reload_weights` "
              "plus a re-pack of the tied lm_head (docs/engines.md). For scale: on an idle machine "
              "../shared/docs/ENVIRONMENT.md measured ~14 / ~43 tok/s (transformers, batch 1 / 8) and "
              "~10 / ~61 tok/s (vLLM) for the same model.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    text = table(measure(args), args)
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
