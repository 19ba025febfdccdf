"""Does the quickstart's warm-up teach the policy to read the preference line?

    python bench/quickstart_warmup_probe.py [--seed 1] [quickstart flags: --hidden 128 --demo-presets all ...]

Builds the quickstart world of one seed (training/quickstart/env.py), warms the tiny policy up
exactly as `make quickstart` does (same flags, same code: `prepare_world`, `prepare_policy`), then
prints, per preference preset, the policy's exact probability of the favoured alias at the
answer decision of every held-out task (the answer turn, with the task's evidence in context),
averaged: a policy that reads the line puts more on it under `favour` than under the others.
Exact probabilities at temperature 1 (no sampling); greedy experts; one thread.  About 4-5 min
of one core with 12 warm-up epochs; more with the defaults' 24 (a lone quickstart run's warm-up
stage: 231 s at 24 epochs, 164 s at 12).  docs/history.md (fourth round) quotes its output.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.context import Budgets
    from training.config import load_config
    from training.quickstart import env as E
    from training.quickstart import run as R
    from training.quickstart.warmup import _alias_positions, demonstrations
    from training.tasks import load_tasks
    from training.session import build_runtime

    args = R._args([a for a in argv if a != "--"])
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cfg = load_config(R.CONFIG, R._paths_overrides(out) + [f"run.seed={args.seed}"])
        started = time.monotonic()
        world = R.prepare_world(out, cfg, args)
        runtime = E.routed_runtime(build_runtime(cfg), {E.DEEP: world["index"], E.SHALLOW: world["index-shallow"]})
        demo_tasks = R.warmup_tasks(world, load_tasks([str(world["train"])]), args)
        warm, _ = R.prepare_policy(out, cfg, runtime, demo_tasks, args)
        tokenizer = AutoTokenizer.from_pretrained(warm)
        model = AutoModelForCausalLM.from_pretrained(warm).eval()
        favoured = tokenizer.encode(E.FAVOURED_ALIAS.rsplit("-", 1)[1], add_special_tokens=False)[0]
        held_out = load_tasks([str(world["eval"])])
        row = {}
        for preset in E.PRESETS:
            tasks = [E.with_preference(t, preset) for t in held_out]
            demos = demonstrations(tasks, tokenizer, runtime.catalog, runtime.retriever, prompts=runtime.prompts,
                                   budgets=Budgets(context_tokens=cfg.rollout.context_tokens), topk=runtime.qa.retrieval.topk)
            probs = []
            for d in demos:
                if d.tool != "answer":
                    continue
                pos = _alias_positions(d)[0]
                with torch.inference_mode():
                    logits = model(input_ids=torch.tensor([d.prompt_ids + d.response_ids[:pos]])).logits[0, -1]
                options = sorted(d.targets[pos])
                probs.append(logits[options].softmax(-1)[options.index(favoured)].item())
            row[preset] = sum(probs) / len(probs)
    flags = " ".join(a for a in argv if a != "--") or "(defaults)"
    print(f"seed {args.seed}, {flags}: p({E.FAVOURED_ALIAS}) at the held-out answer decisions: "
          + ", ".join(f"{k} {v:.3f}" for k, v in row.items()) + f" ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
