"""Policy-update throughput and MFU of a Qwen3-architecture model through our trainer code.

    python bench/gpu_train_step.py                  # on a GPU: Qwen3-0.6B shape, random weights, 8 x 2048 tokens
    python bench/gpu_train_step.py --tiny --device cpu   # a seconds-long check of the script itself

One step = the frozen reference's forward + the policy's forward/backward through
`training.ppo.response_logprobs` and `training.losses.PPOClipLoss` + an AdamW step, as
`training.ppo.ppo_update` (single process) and `training.distributed.update.rank_update`
(DeepSpeed ZeRO-2, here one rank) run them.  Variants:
  trainer-amp      what train.py does for model.dtype bfloat16: fp32 master parameters, bf16
                   autocast, fused AdamW; response_logprobs with the chunked, compiled LM head +
                   log-softmax and compiled decoder layers (training/logprobs.py)
  trainer-amp-eager-layers   the same with model.compile_update false (decoder layers not compiled)
  trainer-amp-before         the same with the full fp32 [tokens x vocab] logits and no compile
                             (response_logprobs before training/logprobs.py)
  trainer-bf16     bf16 parameters and bf16 AdamW (train.py before fp32 master weights; the
                   update rounds away at lr 1e-6: a speed reference only)
  trainer-bf16-ckpt  the same with model.gradient_checkpointing on (activations recomputed in
                   the backward; decoder layers then run eagerly: training/logprobs.py).  At
                   --model 8b these two are what fits one 141 GB card: 16.4 GB of bf16 weights +
                   16.4 of gradients + 32.8 of bf16 AdamW state + the 16.4 GB reference (fp32
                   master weights and states need 131 GB before the reference)
  deepspeed-zero2  rank_update on DeepSpeed ZeRO-2 with bf16 (fp32 master weights inside DeepSpeed)
  trl-grpo         TRL's GRPO update (`trl` 1.16 installed for the bench) on the same model shape and
                   batch: GRPOTrainer built as its defaults have it (bf16 autocast over fp32
                   weights, gradient checkpointing on, its chunked fused LM head, fused AdamW),
                   loss_type "bnpo" (token mean, as ours); one step = the reference's log-probs
                   (`_get_per_token_logps_and_entropies` on its ref_model) + `compute_loss` +
                   backward + grad-norm clip + optimizer step: Trainer.training_step's work without
                   the generation TRL's `_prepare_inputs` would add
  trl-grpo-no-checkpointing   the same with gradient_checkpointing=False (as ours runs)
FLOPs counted: 6 x body params x tokens (train) + 2 x body params x tokens (reference), the LM
head (2 x vocab x hidden per token, x3 train, x1 reference) on response tokens only, and
causal attention (2 x seq^2 x heads x head_dim per layer and row, x3 train, x1 reference).
MFU = counted FLOP/s over the bf16 matrix-product rate measured in the same run.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


VARIANTS = ["trainer-amp-before", "trainer-amp", "trainer-amp-eager-layers", "trainer-bf16", "trainer-bf16-ckpt",
            "deepspeed-zero2",
            "trl-grpo", "trl-grpo-no-checkpointing"]


def matmul_ceiling(device, n: int = 8192, repeats: int = 10) -> float:
    """Measured bf16 dense matrix-product rate, FLOP/s (random data, median)."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def qwen3_config(tiny: bool, size: str = "0.6b"):
    """Qwen3's published shapes (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B), or a tiny
    one for CPU checks of the scripts."""
    from transformers import Qwen3Config

    if tiny:
        return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=size != "8b")
    if size == "8b":
        return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                           tie_word_embeddings=False, rope_theta=1_000_000)
    if size != "0.6b":
        raise ValueError(f"--model {size!r}: choose 0.6b or 8b")
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       tie_word_embeddings=True, rope_theta=1_000_000)


def make_samples(vocab: int, rows: int, seq: int, prompt: int, seed: int = 0):
    from training.samples import TurnSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        ids = torch.randint(10, vocab, (seq,), generator=g).tolist()
        out.append(TurnSample(ids[:prompt], ids[prompt:], [1] * (seq - prompt), None,
                              advantage=1.0 if i % 2 else -1.0, task_id=f"t{i}", turn_index=0))
    return out


def counted_flops(cfg, rows: int, seq: int, prompt: int) -> float:
    body = sum(p for p in _body_params(cfg))
    tokens, response = rows * seq, rows * (seq - prompt)
    head = 2 * cfg.vocab_size * cfg.hidden_size
    attn_fwd = 2 * seq**2 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers * rows
    return (6 + 2) * body * tokens + (3 + 1) * head * response + (3 + 1) * attn_fwd


def _body_params(cfg):
    """Parameters of the matrix products per token in the decoder body (no embeddings)."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size
    yield per_layer * cfg.num_hidden_layers


def time_steps(step, warmup: int, repeats: int, device) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def _full_logits(hidden, weight, targets, temperature=1.0):
    """response_logprobs' LM head before training/logprobs.py: the whole [N, V] logits in fp32."""
    logits = torch.nn.functional.linear(hidden, weight).float()
    if temperature > 0:
        logits = logits / temperature
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def variant_trainer(cfg, samples, device, *, amp: bool, micro: int, before: bool = False, compile_layers=True,
                    checkpointing: bool = False):
    import contextlib
    from unittest import mock

    from transformers import Qwen3ForCausalLM

    import training.logprobs as fast
    from training.losses import PPOClipLoss
    from training.ppo import ppo_update
    from training.precision import Precision

    precision = Precision.of("bfloat16") if amp else Precision(torch.bfloat16)
    torch.manual_seed(0)
    with torch.device(device):                 # random init on the device: seconds, not minutes
        model = Qwen3ForCausalLM(cfg).to(dtype=precision.params).eval()
        reference = Qwen3ForCausalLM(cfg).to(dtype=precision.frozen).eval().requires_grad_(False)
    if checkpointing:                          # model.gradient_checkpointing (training/learner.py)
        model.gradient_checkpointing_enable()
    # train.py's make_optimizer (not imported: its config needs pydantic, absent on the GPU machine)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, fused=device.type == "cuda")
    loss_fn = PPOClipLoss()
    for m in (model, reference):               # model.compile_update (training/logprobs.py)
        fast.set_layer_compile(m, compile_layers and not before)

    def step():
        with contextlib.ExitStack() as stack:
            if before:    # the previous response_logprobs: full logits, no compile
                stack.enter_context(mock.patch.object(fast, "linear_logprobs", _full_logits))
            stack.enter_context(precision.autocast(device))
            return ppo_update(model, reference, optimizer, samples, loss_fn, pad_id=0, device=device,
                              temperature=1.0, micro_batch_size=micro)
    return step, model


def variant_deepspeed(cfg, samples, device, *, micro: int):
    import deepspeed
    from transformers import Qwen3ForCausalLM

    from training.distributed.update import deepspeed_config, rank_update, shard_samples
    from training.losses import PPOClipLoss

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", auto_mpi_discovery=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
        reference = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    ds = deepspeed_config(zero_stage=2, grad_clip=1.0, dtype="bfloat16", offload_optimizer=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
    shard = shard_samples(samples, 1, 1, micro)[0]
    loss_fn = PPOClipLoss()

    def step():
        return rank_update(engine, reference, shard, loss_fn, world=1, pad_id=0, device=device, temperature=1.0)
    return step, engine.module


def variant_trl(cfg, samples, device, *, checkpointing: bool, workdir: Path):
    from datasets import Dataset
    from transformers import Qwen3ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from training.tiny_policy import tiny_tokenizer

    path = workdir / "policy"
    if not (path / "config.json").exists():      # TRL builds its reference from a saved model
        torch.manual_seed(0)
        with torch.device(device):
            Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    tok = tiny_tokenizer(["a b c d e f g"], vocab_size=64)     # ids are given: TRL only needs its pad id
    rows, prompt = len(samples), len(samples[0].prompt_ids)
    completion = len(samples[0].response_ids)
    config = GRPOConfig(output_dir=str(workdir / "trl"), bf16=True, use_cpu=device.type == "cpu", gradient_checkpointing=checkpointing,
                        per_device_train_batch_size=rows, num_generations=rows, max_completion_length=completion,
                        beta=1e-4, epsilon=0.2, epsilon_high=0.28, loss_type="bnpo", learning_rate=1e-6,
                        weight_decay=0.01, max_grad_norm=1.0, report_to="none", save_strategy="no",
                        model_init_kwargs={"dtype": torch.float32})
    trainer = GRPOTrainer(model=str(path), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          args=config, train_dataset=Dataset.from_list([{"prompt": "a"}] * rows), processing_class=tok)
    model = trainer.model.to(device)
    trainer.ref_model.to(device)
    if checkpointing:                           # what Trainer.train() does before its loop
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=config.gradient_checkpointing_kwargs)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1      # set by Trainer.train()'s loop
    ids = torch.tensor([s.prompt_ids + s.response_ids for s in samples], device=device)
    mask = torch.ones_like(ids)
    inputs = {"prompt_ids": ids[:, :prompt], "prompt_mask": mask[:, :prompt], "completion_ids": ids[:, prompt:],
              "completion_mask": mask[:, prompt:], "old_per_token_logps": None,
              "advantages": torch.tensor([s.advantage for s in samples], device=device),
              "num_items_in_batch": mask[:, prompt:].sum()}

    def step():
        model.train()
        with torch.no_grad():
            ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, completion)
        loss = trainer.compute_loss(model, {**inputs, "ref_per_token_logps": ref})
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step, model


def _profile(step, name: str, rows: int = 12) -> None:
    """Where one step's time goes: wall time against the GPU's kernel time (a gap is the
    host's work: Python, hooks, launches), then the `rows` ops with the most GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    kernels = sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA") / 1e6
    print(f"--- {name}: one profiled step {wall:.3f} s wall, {kernels:.3f} s of GPU kernels", flush=True)
    if rows:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--model", default="0.6b", choices=["0.6b", "8b"], help="Qwen3 shape (random weights)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per row (no LM head there)")
    parser.add_argument("--micro", type=int, default=8, help="rows per forward/backward")
    parser.add_argument("--variants", nargs="+", default=["trainer-amp-before", "trainer-amp", "trainer-amp-eager-layers",
                                                          "trainer-bf16", "deepspeed-zero2"])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one step per variant")
    args = parser.parse_args()
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; choose from {VARIANTS}")
    device = torch.device(args.device)
    cfg = qwen3_config(args.tiny, args.model)
    ceiling = matmul_ceiling(device) if device.type == "cuda" else float("nan")
    samples = make_samples(cfg.vocab_size, args.rows, args.seq, args.prompt)
    flops = counted_flops(cfg, args.rows, args.seq, args.prompt)
    tokens = args.rows * args.seq
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "bf16_ceiling_tflops": ceiling / 1e12, "tokens_per_step": tokens,
               "counted_tflop_per_step": flops / 1e12, "variants": {}}
    workdir = Path(tempfile.mkdtemp(prefix="gpu_train_step_"))
    for name in args.variants:
        try:
            if name == "deepspeed-zero2":
                step, model = variant_deepspeed(cfg, samples, device, micro=args.micro)
            elif name.startswith("trl-grpo"):
                step, model = variant_trl(cfg, samples, device, checkpointing=name == "trl-grpo", workdir=workdir)
            else:
                step, model = variant_trainer(cfg, samples, device, amp=name.startswith("trainer-amp"),
                                              micro=args.micro, before=name == "trainer-amp-before",
                                              compile_layers=name != "trainer-amp-eager-layers",
                                              checkpointing=name.endswith("-ckpt"))
            params = sum(p.numel() for p in model.parameters())
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = time_steps(step, args.warmup, args.repeats, device)
            if args.profile:
                _profile(step, name)
            med = statistics.median(times)
            results["variants"][name] = {
                "params": params, "median_s": med, "min_s": min(times), "tokens_per_s": tokens / med,
                "tflops": flops / med / 1e12, "mfu": flops / med / ceiling,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}
        except Exception as exc:   # noqa: BLE001 (report and go on: one variant failing must not lose the others)
            results["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            step = model = None
            gc.collect()            # TRL / accelerate leave reference cycles: free them before the next variant
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(name, json.dumps(results["variants"][name]), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_train_step.json").write_text(json.dumps(results, indent=1))
    print(f"\n{results['device']}, torch {results['torch']}, bf16 ceiling {results['bf16_ceiling_tflops']:.0f} TFLOP/s, "
          f"{tokens} tokens/step, {results['counted_tflop_per_step']:.1f} TFLOP/step counted")
    print(f"{'variant':18s} {'params':>8s} {'s/step':>8s} {'tok/s':>9s} {'TFLOP/s':>8s} {'MFU':>6s} {'GiB':>6s}")
    for name, r in results["variants"].items():
        if "error" in r:
            print(f"{name:18s} error: {r['error'][:200]}")
        else:
            print(f"{name:18s} {r['params'] / 1e6:7.0f}M {r['median_s']:8.3f} {r['tokens_per_s']:9.0f} "
                  f"{r['tflops']:8.1f} {r['mfu']:6.1%} {r['peak_mem_gib'] or 0:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
