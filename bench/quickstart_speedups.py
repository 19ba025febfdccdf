"""The quickstart's three shortcuts, timed against the plain paths they replace (same results):

1. constrained decoding with jump-forward (`HFEngine.jump_forward`): the tokens the allowed
   calls force are appended without a forward pass, vs one pass per token;
2. the warm-up loss with the shared prefix read once (`decision_loss(share_prefix=True)`), vs
   every row read whole (forward + backward);
3. the GRPO update (`training.ppo.ppo_update`, reference + policy passes, 16-row micro-batches)
   over each row's receptive field of the response only (`receptive_crop`: every layer of the
   policy attends within its window), vs every row read whole; a step's samples as the quickstart
   makes them (`--samples` turns of 700 prompt tokens and a 36-token call, its last 2 trained).

Both on the quickstart's tiny policy shape, as its command line's defaults give it (today hidden
128, 2 layers, every layer with a 64-token window; SmolLM2's tokenizer, random weights) with rows
shaped like its prompts: a common 560-token prefix (the system prompt with the tool schemas) and
a 140-token remainder of its own.  One torch thread; median of `--repeats`.

    python bench/quickstart_speedups.py [--rows 32] [--repeats 3] [--write]

--write puts the table into the "Quickstart speed-ups" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import write_section

from orchestrator.embedded import smollm2_path
from orchestrator.engines.interface import SamplingParams
from orchestrator.engines.hf import HFEngine
from orchestrator.toolcall import allowed_call_strings
from training.quickstart.cli import _args
from training.quickstart.env import TOOL_ALIASES
from training.quickstart.warmup import Demonstration, decision_loss
from training.tiny_policy import build_tiny_policy

PREFIX, OWN = 560, 140


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="rows per generate call (the quickstart's max_batch)")
    parser.add_argument("--batch", type=int, default=8, help="warm-up batch size")
    parser.add_argument("--samples", type=int, default=96, help="turn samples in the GRPO update (a quickstart step's ~96)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(1000, 40000, (PREFIX,), generator=gen).tolist()
    rows = [prefix + torch.randint(1000, 40000, (OWN,), generator=gen).tolist() for _ in range(args.rows)]
    choices = allowed_call_strings(TOOL_ALIASES)
    params = SamplingParams(temperature=1.0, max_tokens=48, choices=choices, seed=0)
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        shape = _args([])      # the quickstart's defaults
        path = build_tiny_policy(Path(tmp) / "policy", tok, hidden=shape.hidden, layers=shape.layers, heads=4, seed=0,
                                 local_window=shape.local_window or None, global_layers=shape.global_layers)
        outputs, passes = {}, {}
        for jump in (False, True):
            engine = HFEngine(str(path), device="cpu", seed=0)
            engine.jump_forward = jump
            engine.generate(rows[:2], params)                                          # warm-up
            calls: list[int] = []
            hook = engine.model.register_forward_hook(lambda *a: calls.append(1))
            engine.generate(rows, params)
            hook.remove()
            passes[jump] = len(calls)
            seconds = timed(lambda: outputs.__setitem__(jump, engine.generate(rows, params)), args.repeats)
            table.append((f"generate {args.rows} constrained calls", "jump-forward" if jump else "one pass per token",
                          seconds))
        same = [g.token_ids for g in outputs[False]] == [g.token_ids for g in outputs[True]]

        model = AutoModelForCausalLM.from_pretrained(path).eval()
        call = tok(choices[0], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        demos = [Demonstration(r, call, {len(call) - 3: {call[-3]: 1.0}}, "search") for r in rows[:args.batch]]
        losses = {}

        def step(share: bool) -> None:
            model.zero_grad()
            loss = decision_loss(model, demos, tok.pad_token_id, share_prefix=share)
            loss.backward()
            losses[share] = loss.item()

        for share in (False, True):
            step(share)
            table.append((f"warm-up loss + backward, batch of {args.batch}",
                          "shared prefix once" if share else "whole rows", timed(lambda: step(share), args.repeats)))
        updates = grpo_update(path, rows, call, args, table)
    text = "\n".join([
        "## Quickstart speed-ups",
        "",
        f"Command: `python bench/quickstart_speedups.py --rows {args.rows} --samples {args.samples} --repeats {args.repeats}`. "
        f"Machine: "
        f"{os.cpu_count()}-core CPU ({platform.python_version()}, torch {torch.__version__}), one torch thread, "
        f"load average {os.getloadavg()[0]:.1f} at the end. Tiny policy of the quickstart's shape (hidden "
        f"{shape.hidden}, {shape.layers} layers, a {shape.local_window}-token window in "
        f"{'every layer' if not shape.global_layers else f'all but the last {shape.global_layers}'}), rows of a shared {PREFIX}-token prefix + {OWN} tokens of their own.",
        "",
        "| work | path | seconds (median) |",
        "|---|---|---|",
        *[f"| {w} | {p} | {s:.3f} |" for w, p, s in table],
        "",
        f"Forward passes per generate call (prefill included): {passes[False]} one per token, {passes[True]} "
        f"with jump-forward; calls of {min(len(g.token_ids) for g in outputs[True])}-"
        f"{max(len(g.token_ids) for g in outputs[True])} tokens. "
        f"Same sampled tokens with and without jump-forward: {'yes' if same else 'NO'}; warm-up loss "
        f"{losses[False]:.6f} whole vs {losses[True]:.6f} shared; GRPO update's loss {updates[False]:.6f} whole vs "
        f"{updates[True]:.6f} cut to the receptive field, largest difference of a trained token's log-prob "
        f"{updates['largest log-prob difference']:.1e} (16 rows).",
    ]) + "\n"
    print(text)
    if args.write:
        write_section(text)


def grpo_update(path: Path, rows: list[list[int]], call: list[int], args, table: list) -> dict:
    """`ppo_update` on `args.samples` turns from fresh copies of the policy (and its reference),
    with and without `receptive_crop` (its field set to None: whole rows); appends the rows of
    the table and returns the first update's loss of each path (keys False / True) and the largest
    difference between the two paths' trained-token log-probs on 16 rows."""
    from transformers import AutoModelForCausalLM

    from training import ppo
    from training.losses import PPOClipLoss
    from training.samples import TurnSample, collate_samples

    gen = torch.Generator().manual_seed(1)
    samples = [TurnSample(rows[i % len(rows)], call, [0] * (len(call) - 2) + [1, 1], None,
                          float(torch.randn(1, generator=gen)), "t", 0) for i in range(args.samples)]
    field, losses, logps = ppo.receptive_field, {}, {}
    for cut in (False, True):
        ppo.receptive_field = field if cut else (lambda config: None)
        model, reference = (AutoModelForCausalLM.from_pretrained(path) for _ in range(2))
        with torch.no_grad():
            logps[cut] = ppo.response_logprobs(model, collate_samples(samples[:16], 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)     # lr 0: every repeat updates the same weights

        def update(model=model, reference=reference, optimizer=optimizer) -> float:
            return ppo.ppo_update(model, reference, optimizer, samples, PPOClipLoss(kl_coef=0.1), pad_id=2,
                                  device=torch.device("cpu"), temperature=1.0, micro_batch_size=16,
                                  mini_batches=-(-len(samples) // 16))["train/loss"]
        losses[cut] = update()
        table.append((f"GRPO update, {args.samples} turn samples", "receptive field only" if cut else "whole rows",
                      timed(update, args.repeats)))
    ppo.receptive_field = field
    losses["largest log-prob difference"] = float((logps[True] - logps[False]).abs().max())
    return losses


if __name__ == "__main__":
    main()
