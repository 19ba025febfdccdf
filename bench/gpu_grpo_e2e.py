"""A whole GRPO step, generation included: ours (train.py's LocalLearner) against TRL's `GRPOTrainer.train()`.

    python bench/gpu_grpo_e2e.py                      # on a GPU: Qwen3-0.6B shape, random weights
    python bench/gpu_grpo_e2e.py --tiny --device cpu --prompt-tokens 8 --tokens 8 --steps 2 --trl-steps 2

Both sides start from the same saved model (Qwen3-0.6B shape: 28 layers, hidden 1024, vocab
151,936, random weights saved in bf16, loaded as float32 master weights and trained under bf16
autocast, as train.py's model.dtype bfloat16 does), the same prompts (`--prompts` x
`--prompt-tokens` random token ids, written as text through a word-level tokenizer with one word
per id, so both sides tokenize them to the same ids), group size `--group`, up to `--tokens`
completion tokens at temperature 1, the same reward (the share of even token ids in the
completion's text), GRPO advantages, clipped loss (0.2 / 0.28) + KL to the frozen initial policy
(1e-4), AdamW (lr 1e-6, weight decay 0.01), grad-norm clip 1.0; ours takes an AdamW step per
`--mini-batch` rows (ppo_mini_batch_size: 4 per GRPO step at the defaults, as train.py), TRL one
per generation batch (its default).

ours  `training.learner.LocalLearner` built from training/configs/quickstart.yaml with the model,
      device and dtype overridden: its engine (HFEngine sharing the trained model, decoded by the
      static decoder through a bf16 copy refreshed at every call, behind the BatchingEngine),
      then rewards, `compute_advantages`, `TurnSample`s and `LocalLearner.update` (reference
      log-probs + forward/backward + AdamW + LR schedule): train.py's step for one-turn episodes.
TRL   `GRPOTrainer(...).train()` for `--trl-steps` steps with its own generation (transformers
      `generate`; vLLM is not installed), bf16=True over float32 weights, loss_type "bnpo"
      (token mean, as ours), otherwise its defaults (gradient checkpointing on).
Realistic shapes (`--lengths geometric`, the default): random weights never emit EOS, so each
generate call forces it: row r of call k ends at a length drawn from a geometric distribution
with median `--median-frac` x `--tokens` (0.4: ~18% of rows reach the cap), the same draws on
both sides (`ForcedLengths`: the LM head's EOS logit raised to 1e4 at that row's position, inside
the model, so our CUDA graphs and TRL's generate both see it); prompts are `--prompt-min` ..
`--prompt-tokens` tokens (uniform per prompt).  Row r is the r-th row of the call on both sides
as long as rows keep their places (our static decoder, TRL's generate); our CPU step-by-step
loop drops finished rows, so there the draws land on other rows (same distribution).  `--lengths cap` is the old fixed shape (every
row to the cap, every prompt `--prompt-tokens`).  `compiles` per step: torch._dynamo's new
graphs (a recompile for a new shape counts one per compiled region).
Per step: wall seconds (CUDA-synchronised), completion tokens, and where the time goes:
generation (ours: the engine call; TRL: its "transformers.generate" block), reward, the
reference's forward passes (forward hooks on the reference model), and the rest (the policy's
forward/backward, optimizer, bookkeeping).  The first step of each side compiles / warms up and
is reported apart; tokens/s = completion tokens / seconds over the steps after it.
`--json FILE` writes every number.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def word_tokenizer(vocab: int):
    """One word per token id ("t0" ... "t{vocab-1}"), split on spaces: text <-> ids exactly.
    EOS is the last id, pad the one before (random weights rarely sample either)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token=f"t{vocab - 1}", pad_token=f"t{vocab - 2}",
                                   unk_token="t0")


def build(folder: Path, tiny: bool, device: torch.device) -> tuple[Path, object]:
    from gpu_train_step import qwen3_config
    from transformers import GenerationConfig, Qwen3ForCausalLM

    cfg = qwen3_config(tiny)
    tok = word_tokenizer(cfg.vocab_size)
    cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id = tok.eos_token_id, tok.pad_token_id, None
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    return folder, tok


def prompt_texts(count: int, length: int, vocab: int, shortest: int | None = None) -> list[str]:
    """`count` prompts of random words, each `shortest`..`length` words long (uniform), or `length`."""
    g = torch.Generator().manual_seed(7)
    lengths = (torch.randint(shortest, length + 1, (count,), generator=g).tolist() if shortest else [length] * count)
    return [" ".join(f"t{i}" for i in torch.randint(0, vocab - 2, (n,), generator=g).tolist()) for n in lengths]


def even_share(text: str) -> float:
    """The reward, on text, for both sides: the share of the completion's words with an even id."""
    ids = [int(w[1:]) for w in text.split() if w[1:].isdigit()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


class ForcedLengths:
    """Per-row completion lengths of the current generate call, shared by every copy of the
    model (deepcopy returns the same object: our static decoder decodes a bf16 copy)."""

    NONE = 1 << 30

    def __init__(self, rows: int, cap: int, median_frac: float, device, seed: int = 0):
        import math

        self.rows, self.cap, self.seed = rows, cap, seed
        self.rate = math.log(2) / max(1.0, median_frac * cap)       # P(stop) per token: median = frac x cap
        self.targets = torch.full((rows,), self.NONE, dtype=torch.long, device=device)
        self.counter = torch.zeros(1, dtype=torch.long, device=device)
        self.active, self.calls = False, 0

    def __deepcopy__(self, memo):
        return self

    def draw(self, call: int, n: int) -> list[int]:
        """n lengths in 1..cap: 1 + floor(Exponential(rate)), capped (a geometric distribution)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + call)
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return [min(self.cap, 1 + int(x)) for x in (-torch.log1p(-u) / self.rate).tolist()]

    @contextlib.contextmanager
    def generating(self, n: int):
        lengths = self.draw(self.calls, n)
        self.calls += 1
        self.targets.fill_(self.NONE)
        self.targets[:n].copy_(torch.tensor(lengths))
        self.counter.zero_()
        self.active = True
        try:
            yield lengths
        finally:
            self.active = False


class ForcedEOSHead(torch.nn.Linear):
    """The LM head (same weight Parameter, no bias) that, while `state.active`, sets the EOS logit
    of row r's last position to 1e4 when `state.counter` (tokens produced so far in the call) is
    that row's length - 1, then counts one token.  A forward pre-hook on the model zeroes the
    counter at each prefill (a forward of more than one token per row)."""

    def __init__(self, head: torch.nn.Linear, eos: int, state: ForcedLengths):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = head.in_features, head.out_features
        self.weight, self.bias, self.eos, self.state = head.weight, None, eos, state

    def forward(self, x):
        logits = torch.nn.functional.linear(x, self.weight)
        st = self.state
        if st.active:
            n = logits.shape[0]
            hit = (st.targets[:n] - 1) == st.counter                            # [B]
            last = logits[:, -1, self.eos]
            logits[:, -1, self.eos] = torch.where(hit, torch.full_like(last, 1e4), last)
            st.counter.add_(1)
        return logits


def force_lengths(model, eos: int, state: ForcedLengths) -> None:
    """Put `ForcedEOSHead` in as `model`'s LM head and the counter reset on its prefill."""
    model.lm_head = ForcedEOSHead(model.lm_head, eos, state)

    def reset(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if state.active and ids is not None and ids.shape[1] > 1:
            state.counter.zero_()
    model.register_forward_pre_hook(reset, with_kwargs=True)


def compiled_graphs() -> int:
    """Graphs torch._dynamo has compiled in this process (each recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class ForwardTimer:
    """Seconds spent in a module's forward calls (synchronised at both ends)."""

    def __init__(self, module, device: torch.device):
        self.seconds, self.device, self._t = 0.0, device, 0.0
        module.register_forward_pre_hook(lambda *a: setattr(self, "_t", sync(device)))
        module.register_forward_hook(lambda *a: setattr(self, "seconds", self.seconds + sync(device) - self._t))

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


class ReferenceTimer:
    """Seconds of our update's reference log-probs: `micro_logprobs` (ppo_update's helper, body
    + chunked LM head) timed when it scores the reference model."""

    def __init__(self, reference, device: torch.device):
        from training.ppo import ppo_update

        self.scope, self.seconds = ppo_update.__globals__, 0.0
        self.original = self.scope["micro_logprobs"]

        def timed(model, *a, **k):
            if model is not reference:
                return self.original(model, *a, **k)
            t = sync(device)
            try:
                return self.original(model, *a, **k)
            finally:
                self.seconds += sync(device) - t
        self.scope["micro_logprobs"] = timed

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s

    def close(self) -> None:
        self.scope["micro_logprobs"] = self.original


from training.compile_cache import load_compile_artifacts, save_compile_artifacts  # noqa: E402 (after sys.path)


def run_ours(path: Path, tok, prompts: list[str], args, device: torch.device) -> list[dict]:
    from orchestrator.engines.interface import SamplingParams
    from training.algorithms import compute_advantages
    from training.config import load_config
    from training.learner import LocalLearner
    from training.samples import TurnSample

    rows = args.prompts * args.group
    cfg = load_config(ROOT / "training/configs/quickstart.yaml", [
        f"model.path={path}", "model.dtype=bfloat16", f"run.device={device}", "run.threads=0",
        f"engine.max_batch={rows}", f"algorithm.micro_batch_size={args.micro}",
        f"algorithm.ppo_mini_batch_size={args.mini_batch}", "optim.lr=1e-6",
        "optim.weight_decay=0.01", "optim.grad_clip=1.0", "algorithm.kl_coef=1e-4", "rollout.temperature=1.0"])
    learner = LocalLearner(cfg, None, {}, total_steps=args.steps)
    forced = None
    if args.lengths == "geometric":
        forced = ForcedLengths(rows, args.tokens, args.median_frac, device)
        force_lengths(learner.model, tok.eos_token_id, forced)
    ref_timer = ReferenceTimer(learner.reference, device)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    steps = []
    try:
        for i in range(args.steps):
            batch = [p for p in ids[i * args.prompts:(i + 1) * args.prompts] for _ in range(args.group)]
            graphs = compiled_graphs()
            t0 = sync(device)
            with forced.generating(len(batch)) if forced else contextlib.nullcontext():
                gens = learner.engine.generate(batch, SamplingParams(temperature=1.0, max_tokens=args.tokens,
                                                                     seed=1000 * i))
            t1 = sync(device)
            rewards = [even_share(g.text) for g in gens]
            advantages = compute_advantages(rewards, [k // args.group for k in range(rows)], "grpo").tolist()
            samples = [TurnSample(p, list(g.token_ids), [1] * len(g.token_ids), list(g.logprobs), a, str(k // args.group), 0)
                       for k, (p, g, a) in enumerate(zip(batch, gens, advantages))]
            t2 = sync(device)
            ref_timer.take()
            learner.update(samples, i)
            t3 = sync(device)
            ref = ref_timer.take()
            steps.append({"step_s": t3 - t0, "generation_s": t1 - t0, "reward_s": t2 - t1, "reference_s": ref,
                          "update_s": t3 - t2 - ref, "completion_tokens": sum(len(g.token_ids) for g in gens),
                          "prompt_tokens": sum(len(p) for p in batch), "compiles": compiled_graphs() - graphs,
                          "lengths": [len(g.token_ids) for g in gens]})
            print(f"ours step {i + 1}: {steps[-1]}", flush=True)
            if i == 0 and args.compile_artifacts:   # what step 1 compiled, for a later process (run.compile_artifacts)
                print(f"compile artifacts: {save_compile_artifacts(str(args.compile_artifacts))} bytes written", flush=True)
    finally:
        ref_timer.close()
        learner.close()
    del learner
    return steps


def run_trl(path: Path, tok, prompts: list[str], args, device: torch.device, workdir: Path,
            cache: str | None = None) -> list[dict]:
    import trl.trainer.grpo_trainer as grpo_module
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = args.prompts * args.group
    blocks: dict[str, float] = {}

    @contextlib.contextmanager
    def timed_block(trainer, name):        # TRL's own profiling blocks ("transformers.generate", rewards)
        t = sync(device)
        try:
            yield
        finally:
            blocks[name] = blocks.get(name, 0.0) + sync(device) - t
    steps: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.graphs = compiled_graphs()
            blocks.clear()
            ref_timer.take()
            self.t = sync(device)

        def on_step_end(self, *a, **k):
            wall = sync(device) - self.t
            gen = sum(v for k_, v in blocks.items() if "generate" in k_)
            reward = sum(v for k_, v in blocks.items() if "generate" not in k_)
            ref = ref_timer.take()
            steps.append({"step_s": wall, "generation_s": gen, "reward_s": reward, "reference_s": ref,
                          "update_s": wall - gen - reward - ref, "completion_tokens": 0,
                          "compiles": compiled_graphs() - self.graphs, "blocks": dict(blocks)})

        def on_log(self, _args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs and steps:
                steps[-1]["completion_tokens"] = round(logs["completions/mean_length"] * rows)
                print(f"TRL step {len(steps)}: {steps[-1]}", flush=True)

    def reward(completions, **kw):
        return [even_share(c) for c in completions]

    data = Dataset.from_list([{"prompt": p} for p in prompts[:args.prompts * args.trl_steps]])
    config = GRPOConfig(output_dir=str(workdir / "trl"), bf16=device.type == "cuda", use_cpu=device.type == "cpu",
                        per_device_train_batch_size=rows, num_generations=args.group,
                        max_completion_length=args.tokens, temperature=1.0, beta=1e-4, epsilon=0.2, epsilon_high=0.28,
                        loss_type="bnpo", learning_rate=1e-6, weight_decay=0.01, max_grad_norm=1.0,
                        max_steps=args.trl_steps, logging_steps=1, save_strategy="no", report_to="none",
                        num_iterations=1, shuffle_dataset=False,
                        # a static cache is allocated in the weights' dtype while bf16 autocast writes bf16 keys
                        # into it (index_copy_ dtype error on the H200, 2026-12-04): static runs with bf16 weights
                        model_init_kwargs={"dtype": torch.bfloat16 if cache == "static" and device.type == "cuda"
                                           else torch.float32},
                        cache_implementation=cache)
    original = grpo_module.profiling_context
    grpo_module.profiling_context = timed_block
    try:
        trainer = GRPOTrainer(model=str(path), reward_funcs=reward, args=config, train_dataset=data,
                              processing_class=tok, callbacks=[Timer()])
        ref_timer = ForwardTimer(trainer.ref_model, device)
        if args.lengths == "geometric":
            forced = ForcedLengths(rows, args.tokens, args.median_frac, device)
            force_lengths(trainer.model, tok.eos_token_id, forced)
            plain = trainer.model.generate

            def generate(*a, **k):
                ids = k.get("input_ids", a[0] if a else None)
                with forced.generating(ids.shape[0]):
                    return plain(*a, **k)
            trainer.model.generate = generate
        trainer.train()
    finally:
        grpo_module.profiling_context = original
    del trainer
    return steps


def summary(steps: list[dict]) -> dict:
    counted = steps[1:] or steps
    total = sum(s["step_s"] for s in counted)
    parts = {k: sum(s[k] for s in counted) / total for k in ("generation_s", "reward_s", "reference_s", "update_s")}
    return {"first_step_s": steps[0]["step_s"], "step_s_median": statistics.median(s["step_s"] for s in counted),
            "steps_counted": len(counted), "completion_tokens_per_step": statistics.median(s["completion_tokens"] for s in counted),
            "tokens_per_s": sum(s["completion_tokens"] for s in counted) / total,
            "share": parts, "seconds_median": {k: statistics.median(s[k] for s in counted) for k in parts},
            "compiles_first_step": steps[0].get("compiles", 0), "compiles_after": sum(s.get("compiles", 0) for s in counted),
            "steps_with_compiles": sum(bool(s.get("compiles")) for s in counted),
            "slowest_step_s": max(s["step_s"] for s in counted)}


def markdown(results: dict, args) -> str:
    """The docs/benchmarks.md table of this run."""
    names = {"ours": "ours (train.py's LocalLearner: static decoder + ppo_update)",
             "trl": f"TRL {results['info'].get('trl', '')} GRPOTrainer.train() (transformers generate, dynamic cache)",
             "trl-static": f"TRL {results['info'].get('trl', '')} GRPOTrainer.train() (cache_implementation static, bf16 weights)"}
    lines = [("| implementation | first step s | compiles: first step / after | step s (median / slowest) | "
              "completion tokens / step | tokens/s | generation s | reward s | reference s | update + rest s | peak GiB |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for side, name in names.items():
        if side not in results:
            continue
        m = results[side]["summary"]
        sec = m["seconds_median"]
        lines.append(f"| {name} | {m['first_step_s']:.1f} | {m['compiles_first_step']} / {m['compiles_after']} | "
                     f"{m['step_s_median']:.2f} / {m['slowest_step_s']:.2f} | "
                     f"{m['completion_tokens_per_step']:.0f} | {m['tokens_per_s']:,.0f} | {sec['generation_s']:.2f} | "
                     f"{sec['reward_s']:.3f} | {sec['reference_s']:.2f} | {sec['update_s']:.2f} | "
                     f"{results['info'].get(side + '_peak_gib', 0):.1f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen3 config (checks the script)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (GRPO group size)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt tokens (at most, with --prompt-min)")
    parser.add_argument("--prompt-min", type=int, default=64, help="fewest prompt tokens (--lengths geometric)")
    parser.add_argument("--tokens", type=int, default=512, help="completion tokens at most (the cap)")
    parser.add_argument("--lengths", choices=["geometric", "cap"], default="geometric",
                        help="completion lengths: forced EOS at geometric draws (median --median-frac x cap), or "
                             "every row to the cap with every prompt --prompt-tokens long (the old fixed shape)")
    parser.add_argument("--median-frac", type=float, default=0.4, help="median completion length / cap")
    parser.add_argument("--micro", type=int, default=16, help="our rows per forward/backward (quickstart: 16)")
    parser.add_argument("--mini-batch", type=int, default=16,
                        help="our rows per AdamW step (ppo_mini_batch_size, quickstart/paper: 16; TRL takes one)")
    parser.add_argument("--steps", type=int, default=6, help="our steps (the first compiles: reported apart)")
    parser.add_argument("--trl-steps", type=int, default=3, help="TRL steps (the first reported apart)")
    parser.add_argument("--sides", nargs="+", default=["ours", "trl"], choices=["ours", "trl", "trl-static"])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--compile-artifacts", type=Path,
                        help="run.compile_artifacts: load this file before our side compiles, else write it after step 1")
    args = parser.parse_args()
    if args.compile_artifacts:
        print(load_compile_artifacts(str(args.compile_artifacts)) or "compile artifacts: none yet", flush=True)
    device = torch.device(args.device)
    info = {"args": {k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__}
    if device.type == "cuda":
        info["card"] = torch.cuda.get_device_name(device)
    import transformers
    info["transformers"] = transformers.__version__
    results: dict = {"info": info}
    with tempfile.TemporaryDirectory() as tmp:
        path, tok = build(Path(tmp) / "policy", args.tiny, device)
        prompts = prompt_texts(args.prompts * max(args.steps, args.trl_steps), args.prompt_tokens, len(tok),
                               args.prompt_min if args.lengths == "geometric" else None)
        for side in args.sides:
            if side == "ours":
                steps = run_ours(path, tok, prompts, args, device)
            else:
                import trl
                info["trl"] = trl.__version__
                steps = run_trl(path, tok, prompts, args, device, Path(tmp),
                                cache="static" if side == "trl-static" else None)
            gc.collect()
            if device.type == "cuda":
                info[f"{side}_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            results[side] = {"steps": steps, "summary": summary(steps)}
            print(side, json.dumps(results[side]["summary"]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print(markdown(results, args))
    trl_sides = [k for k in ("trl", "trl-static") if k in results]
    if "ours" in results and trl_sides:
        best = max(results[k]["summary"]["tokens_per_s"] for k in trl_sides)
        ratio = results["ours"]["summary"]["tokens_per_s"] / best
        results["ours_over_trl_tokens_per_s"] = ratio
        print(f"ours / TRL's fastest tokens/s: {ratio:.2f}x (target >= 5x: {'met' if ratio >= 5 else 'not met'})")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
