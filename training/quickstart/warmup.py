"""Supervised warm-up of the tiny random policy on synthesized demonstrations.

A randomly initialised policy cannot read a question yet, so before GRPO it is taught,
by cross-entropy on a few hundred demonstrated turns, *which tool
kind* answers which question: search then answer for lookups, enhance_reasoning then
answer for arithmetic.  Every decision is demonstrated once with *each* alias the tool
offers, so the target alias distribution is exactly uniform: the warmed-up policy knows
the protocol but nothing about price, and the cost and preference behaviour that follows
is learned by GRPO from the reward alone.

Each demonstrated turn is exactly what the loop shows and records at run time: the
context rebuilt by `orchestrator.context.build_messages`, rendered by
`orchestrator.policy.render_prompt`, and the canonical tokens of one allowed call + EOS;
the loss covers only the tokens where constrained decoding leaves a choice (the tool
name, the alias), as in the GRPO phase.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from orchestrator.context import Budgets, CodeBlock, Document, EpisodeState, Prompts, TokenCounter, build_messages
from orchestrator.loop import Task, task_catalog
from orchestrator.policy import render_prompt
from orchestrator.toolcall import allowed_call_strings, format_tool_call
from training.samples import TurnSample, collate_samples
from training.trainer import choice_token_ids, decision_mask, response_logprobs

EVIDENCE_TOOL = {"lookup": "search", "arithmetic": "enhance_reasoning"}


def _turn(tokenizer, catalog, prompts, budgets, state, tool: str, alias: str, task_id: str, index: int) -> TurnSample:
    qa = [t for t in catalog.tools if t.kind in ("search", "code", "answer")]
    messages = build_messages(state, prompts, budgets, TokenCounter(tokenizer))
    prompt = tokenizer(render_prompt(tokenizer, messages, catalog.openai_tools(tools=qa)),
                       add_special_tokens=False)["input_ids"]
    choices = choice_token_ids(tokenizer, allowed_call_strings({t.name: list(t.aliases) for t in qa}))
    response = choice_token_ids(tokenizer, [format_tool_call(tool, {"model": alias})])[0]
    # loss only where the constraint leaves a choice (tool name, alias), as in GRPO
    return TurnSample(prompt, response, decision_mask(response, choices), None, 1.0, task_id, index)


def _evidence(task: Task, state: EpisodeState, retriever, topk: int) -> None:
    """What the evidence tool would have added: retrieved documents, or a code result."""
    if task.metadata["type"] == "lookup":
        hits = retriever.retrieve([task.question], topk)[0]
        state.add_documents([Document(id=str(h["document"]["id"]), contents=h["document"]["contents"]) for h in hits])
    else:
        expression = task.question.split("What is ", 1)[1].split("?", 1)[0]
        state.code_blocks.append(CodeBlock(code=f"print({expression})", output=task.answer))


def demonstrations(tasks: list[Task], tokenizer, base_catalog, retriever, *, prompts: Prompts,
                   budgets: Budgets, topk: int) -> list[TurnSample]:
    """Per task: the evidence call once per alias of its tool, then the answer call once per
    answer alias (in the context the evidence call produced)."""
    samples = []
    for task in tasks:
        catalog = task_catalog(base_catalog, task)
        state = EpisodeState(task.question)
        tool = EVIDENCE_TOOL[task.metadata["type"]]
        samples += [_turn(tokenizer, catalog, prompts, budgets, state, tool, a, task.id, 0) for a in task.tools[tool]]
        _evidence(task, state, retriever, topk)
        samples += [_turn(tokenizer, catalog, prompts, budgets, state, "answer", a, task.id, 1)
                    for a in task.tools["answer"]]
    return samples


def supervised_warmup(model_dir: Path, out_dir: Path, samples: list[TurnSample], *, epochs: int, lr: float,
                      batch_size: int, seed: int, log=print) -> Path:
    """Cross-entropy on the demonstrated decisions; saves the warmed-up policy to `out_dir`.

    Each epoch visits every demonstrated turn once, with its aliases taken in rotation
    (turn k in epoch e gets alias (k + e) mod n), so every epoch demonstrates each alias
    about equally often at a fraction of the forward passes of all aliases at once; the
    learning rate decays linearly to 0 so the alias choice settles near uniform.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()   # eval: no dropout
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    turns: dict[tuple[str, int], list[TurnSample]] = {}
    for s in samples:
        turns.setdefault((s.task_id, s.turn_index), []).append(s)
    total = epochs * -(-len(turns) // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    rng = random.Random(seed)
    started = time.monotonic()
    for epoch in range(epochs):
        order = [options[(k + epoch) % len(options)] for k, options in enumerate(turns.values())]
        rng.shuffle(order)
        losses = []
        for i in range(0, len(order), batch_size):
            batch = collate_samples(order[i:i + batch_size], tokenizer.pad_token_id)
            logp = response_logprobs(model, batch)                                     # [B, L]
            loss = -logp[batch.response_mask.bool()].mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
        log(f"warm-up epoch {epoch + 1}/{epochs}: loss {sum(losses) / len(losses):.4f} "
            f"({time.monotonic() - started:.0f} s)")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
