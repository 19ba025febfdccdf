"""GRPO step throughput: ours against TRL's `GRPOTrainer`, same tiny model, single-turn, CPU.

    python bench/grpo_vs_trl.py [--prompts 4] [--group 8] [--tokens 32] [--steps 11] [--write]

Both sides, from the same saved tiny random Llama: P prompts x G completions of up to
`--tokens` tokens sampled at T = 1, a reward (the share of completion characters that
are vowels), group-relative advantages, clipped policy loss with the KL loss to a frozen
reference (beta 1e-4, eps 0.2 / 0.28), AdamW (lr 1e-6), one optimizer step per batch.
Step time includes generation, reward and update; tokens/s = completion tokens / step
time.  The first step of each run is a warm-up and not counted.

Ours: `HFEngine` generation + `training.ppo.ppo_update` (the code `train.py` runs).
TRL (1.16, installed for this bench only: `pip install trl`): `GRPOTrainer` with
`use_cpu=True`, transformers generation.
The two take turns step by step (TRL's step i, then ours, from a TRL callback outside TRL's
timed span), against load drift on a shared machine.
--write puts the table into the "Training" section of docs/benchmarks.md (bench/_report.py).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _report import load, machine, write_section  # noqa: E402

from orchestrator.engines.interface import SamplingParams  # noqa: E402

QUESTIONS = ["Tell me about the sea.", "Name a colour.", "What is a lighthouse?", "Describe a cat.",
             "Say something kind.", "Count to five.", "What is rain?", "Why is the sky blue?"]


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / max(1, len(letters))


def build(folder: Path) -> Path:
    from training.tiny_policy import build_tiny_policy, tiny_tokenizer

    texts = QUESTIONS * 20 + ["the quick brown fox jumps over the lazy dog " * 20]
    return build_tiny_policy(folder, tiny_tokenizer(texts, vocab_size=600), hidden=64, layers=2)


def ours(path: Path, args) -> Callable[[int], tuple[float, int]]:
    """Our GRPO step on a fresh copy of the model: step(i) -> (seconds, completion tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.algorithms import compute_advantages
    from orchestrator.engines import make_engine
    from training.losses import PPOClipLoss
    from training.samples import TurnSample
    from training.ppo import ppo_update

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    reference = copy.deepcopy(model).requires_grad_(False)
    engine = make_engine("hf", model, tokenizer=tok, device="cpu", max_batch=args.prompts * args.group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    loss_fn = PPOClipLoss(0.2, 0.28, 10.0, kl_coef=1e-4)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for i in range(args.prompts)]

    def step(i: int) -> tuple[float, int]:
        started = time.monotonic()
        batch = [p for p in prompts for _ in range(args.group)]
        gens = engine.generate(batch, SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=i * 1000))
        rewards = [vowel_share(g.text) for g in gens]
        advantages = compute_advantages(rewards, [k // args.group for k in range(len(batch))], "grpo")
        samples = [TurnSample(p, g.token_ids, [1] * len(g.token_ids), None, float(a), str(k), 0)
                   for k, (p, g, a) in enumerate(zip(batch, gens, advantages.tolist()))]
        ppo_update(model, reference, optimizer, samples, loss_fn, pad_id=tok.pad_token_id, device="cpu",
                   temperature=1.0, micro_batch_size=len(samples))
        return time.monotonic() - started, sum(len(g.token_ids) for g in gens)
    return step


def trl(path: Path, args, workdir: Path, between: Callable[[int], None] = lambda i: None) -> list[tuple[float, int]]:
    """(seconds, completion tokens) of each `GRPOTrainer` step; `between(i)` runs after step i,
    outside the timed span."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    steps: list[tuple[float, int]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.monotonic()

        def on_step_end(self, *a, **k):
            steps.append((time.monotonic() - self.t, 0))
            between(len(steps) - 1)

        def on_log(self, _args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs and steps:
                n = round(logs["completions/mean_length"] * args.prompts * args.group)
                steps[-1] = (steps[-1][0], n)

    def reward(completions, **kw):
        return [vowel_share(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}
                              for i in range(args.prompts * args.steps)])
    config = GRPOConfig(output_dir=str(workdir), use_cpu=True, per_device_train_batch_size=args.prompts * args.group,
                        num_generations=args.group, max_completion_length=args.tokens, temperature=1.0,
                        beta=1e-4, epsilon=0.2, epsilon_high=0.28, learning_rate=1e-6, weight_decay=0.0,
                        max_steps=args.steps, logging_steps=1, save_strategy="no", report_to="none",
                        num_iterations=1, shuffle_dataset=False, disable_dropout=True, bf16=False)
    trainer = GRPOTrainer(model=str(path), reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(path), callbacks=[Timer()])
    trainer.train()
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on a busy shared CPU, 2 threads wait on each other, ~18x slower)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = load()
    with tempfile.TemporaryDirectory() as tmp:
        path = build(Path(tmp) / "policy")
        # step by step in turn (TRL step i, then our step i), so that the shared machine's
        # changing load hits both sides alike
        our_step = ours(path, args)
        mine = [our_step(0)]                              # our warm-up, before TRL's first step

        def after_trl_step(i: int) -> None:               # ours i + 1 runs between TRL's i and i + 1
            if i + 1 < args.steps:
                mine.append(our_step(i + 1))
        theirs = trl(path, args, Path(tmp) / "trl", between=after_trl_step)
    runs = [("ours (HFEngine + ppo_update)", mine), ("TRL GRPOTrainer", theirs)]
    table = ["| implementation | step s (median) | steps 2.. s | completion tokens / step (median) | tokens/s (steps 2..) |",
             "|---|---:|---|---:|---:|"]
    rate = {}
    for name, steps in runs:
        counted = steps[1:] or steps        # step 1 of each is a warm-up
        rate[name] = sum(n for _, n in counted) / sum(s for s, _ in counted)
        secs, tokens = statistics.median(s for s, _ in counted), statistics.median(n for _, n in counted)
        table.append(f"| {name} | {secs:.2f} | {', '.join(f'{s:.2f}' for s, _ in counted)} | {tokens:.0f} | "
                     f"{rate[name]:.0f} |")
    per_step = [t[0] / o[0] for o, t in zip(mine[1:], theirs[1:])]
    ratio = rate[runs[0][0]] / rate[runs[1][0]]
    verdict = (f"Ours / TRL tokens/s: **{ratio:.2f}x** (target >= 1.2x: {'met' if ratio >= 1.2 else 'not met'}); "
               f"TRL's step time / ours, step by step: {', '.join(f'{r:.2f}' for r in per_step)} "
               f"(median {statistics.median(per_step):.2f}).")
    print("\n".join(table) + "\n\n" + verdict)
    if args.write:
        from trl import __version__ as trl_version

        write_section("\n".join([
            "### GRPO step vs TRL", "",
            f"Single-turn GRPO steps on the same tiny random Llama (hidden 64, 2 layers, 600-token BPE): "
            f"{args.prompts} prompts x {args.group} completions of up to {args.tokens} tokens at T = 1, "
            "vowel-share reward, group-relative advantages, clipped loss (0.2 / 0.28) + KL loss to a frozen "
            "reference (1e-4), AdamW 1e-6, one optimizer step per batch. A step is generation + reward + "
            "reference log-probs + forward/backward + optimizer step; tokens/s = completion tokens / step "
            f"seconds, summed over steps 2..{args.steps} (step 1 is a warm-up). One process, the two taking turns "
            "step by step (TRL's step i, then ours), so that load changes on the shared machine hit both. "
            "Target: ours >= 1.2x TRL's tokens/s.", "",
            f"Machine: {machine(f'torch {torch.__version__}, TRL {trl_version}, {args.threads} torch thread(s)')}; shared with other "
            f"workers' jobs (1-minute load average {load_start:.1f} at the start, {load():.1f} at the end).", "",
            f"Command: `python bench/grpo_vs_trl.py --prompts {args.prompts} --group {args.group} "
            f"--tokens {args.tokens} --steps {args.steps} --threads {args.threads} --write`", "", *table, "", verdict]), under="## Training")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
