"""What the quickstart's embedded SmolLM2-135M does with its prompts (docs/training.md#the-learning-quickstart).

    python bench/quickstart_experts.py [--tasks 40] [--seed 0]

1. answer prompts: the greedy answer expert (alias answer-math-2) on hand-built contexts of the
   quickstart world's warm-up + training tasks (a lookup with its deep passage, a sum with its code
   output), per prompt variant: how many replies contain the reference (the quickstart's judge);
2. prompted alias choice: the prompted SmolLM2's answer-alias distribution (what the per-turn
   warm-up teaches) under each preference preset, averaged over arithmetic demonstrations.
Deterministic (greedy, one thread); prints two tables.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

ANSWER_VARIANTS = {
    "shipped": None,   # training/quickstart/prompts/expert_answer_tags.txt
    "previous": "{context}Using the information above, answer: {question}\nReply in a few words.\n",
    "answer-only": "{context}Question: {question}\nReply with the answer only, in a few words.\n",
    "hold-the-answer": "{context}The output and documents above hold the answer. Question: {question}\n"
                       "Reply in a few words.\n",
}


def _world(tmp: Path, seed: int):
    from training.quickstart.env import build_index, build_world, quickstart_catalog

    paths = build_world(tmp / "world", n_train=16, n_eval=0, n_warmup=32, seed=seed)
    quickstart_catalog(tmp / "world")
    return paths, build_index(paths["corpus"], tmp / "world" / "index")


def answer_prompts(tmp: Path, paths, index: Path, n_tasks: int) -> list[tuple[str, int, int, int, int]]:
    from orchestrator.context import CodeBlock, Document, EpisodeState, Prompts
    from training.config import load_config
    from training.quickstart.run import CONFIG
    from training.tasks import load_tasks
    from training.session import build_runtime

    cfg = load_config(CONFIG, [f"tools.catalog={tmp / 'world' / 'tools.json'}", f"tools.index={index}"])
    runtime = build_runtime(cfg)
    tasks = (load_tasks([str(paths["warmup"])]) + load_tasks([str(paths["train"])]))[:n_tasks]
    rows = []
    for name, text in ANSWER_VARIANTS.items():
        folder = tmp / f"prompts-{name}"
        shutil.copytree(cfg.tools.prompts, folder)
        if text is not None:
            (folder / "expert_answer_tags.txt").write_text(text)
        runtime.prompts = Prompts.load(folder)
        right, total = defaultdict(int), defaultdict(int)
        for task in tasks:
            question = task.question.split("\nPreference:")[0]
            state, kind = EpisodeState(question), task.metadata["type"]
            if kind == "lookup":
                hits = runtime.retriever.retrieve([question], 1)[0]
                state.add_documents([Document(id=str(h["document"]["id"]), contents=h["document"]["contents"])
                                     for h in hits])
            else:
                expression = question.split("What is ", 1)[1].split("?", 1)[0]
                state.code_blocks.append(CodeBlock(code=f"print({expression})", output=task.answer))
            _, answer = runtime.call("answer", "answer-math-2", state)
            total[kind] += 1
            right[kind] += task.answer.lower() in (answer or "").lower()
        rows.append((name, right["lookup"], total["lookup"], right["arithmetic"], total["arithmetic"]))
    return rows


def prompted_choice(tmp: Path, paths, index: Path, n_tasks: int) -> dict[str, dict[str, float]]:
    from transformers import AutoTokenizer

    from orchestrator.catalog import load_catalog
    from orchestrator.context import Budgets, Prompts
    from orchestrator.embedded import smollm2_path
    from retrieval.client import RetrievalClient
    from training.quickstart.env import PRESETS, PROMPTS_DIR, task_tools, with_preference
    from training.quickstart.warmup import demonstrations, prompted_alias_choices
    from training.tasks import load_tasks

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    tools = task_tools()
    arith = [t for t in load_tasks([str(paths["warmup"])]) if t.metadata["type"] == "arithmetic"][:n_tasks]
    tasks = [with_preference(dataclasses.replace(t, tools=tools), p) for t in arith for p in PRESETS]
    demos = demonstrations(tasks, tokenizer, load_catalog(tmp / "world" / "tools.json"),
                           RetrievalClient.in_process(str(index)), prompts=Prompts.load(PROMPTS_DIR),
                           budgets=Budgets(context_tokens=2048), topk=1)
    demos = [d for d in demos if d.tool == "answer"]
    sums: dict = defaultdict(lambda: defaultdict(list))
    for demo, choice in zip(demos, prompted_alias_choices(demos)):
        for token, p in choice.items():
            sums[demo.preset][tokenizer.decode([token])].append(p)
    return {preset: {alias: round(sum(ps) / len(ps), 3) for alias, ps in by.items()} for preset, by in sums.items()}


def main(argv: list[str] | None = None) -> None:
    import os

    import torch
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40, help="contexts for the answer prompts")
    parser.add_argument("--choice-tasks", type=int, default=12, help="arithmetic prompts per preset for the choice")
    parser.add_argument("--seed", type=int, default=0, help="the quickstart world's seed")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    console = Console()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        paths, index = _world(tmp, args.seed)
        table = Table(title=f"answer expert (SmolLM2-135M, greedy) on {args.tasks} contexts, world seed {args.seed}")
        for col in ("prompt", "lookups right", "sums right", "all"):
            table.add_column(col, justify="right")
        for name, lr, lt, ar, at in answer_prompts(tmp, paths, index, args.tasks):
            table.add_row(name, f"{lr}/{lt}", f"{ar}/{at}", f"{lr + ar}/{lt + at}")
        console.print(table)
        table = Table(title=f"prompted SmolLM2's answer-alias choice per preset ({args.choice_tasks} arithmetic prompts each)")
        table.add_column("preset")
        table.add_column("mean distribution over the answer aliases' first differing token")
        for preset, dist in prompted_choice(tmp, paths, index, args.choice_tasks).items():
            table.add_row(preset, str(dist))
        console.print(table)


if __name__ == "__main__":
    main()
