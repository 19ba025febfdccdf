"""Does a policy read the favour line?  The favoured alias's probability at the answer turn.

For held-out tasks, the answer turn as the loop shows it (the evidence tool's result in context,
`warmup.demonstrations`), under each preference line: the policy's next-token distribution at the
answer alias decision, restricted to the answer aliases (teacher-forced, no sampling), and the
mean probability of `FAVOURED_ALIAS` there.  A policy that reads the line gives it more under
`favour` than under the other lines; `favour_other_alias` (the line naming answer-1) says whether it
reads *which* alias the line names (training lines name answer-4 alone by default, so it need not).

    reading = favour_reading(model_dir, tasks, runtime, budgets=..., topk=...)
    # {"favour": 0.56, "favour_paraphrase": 0.56, "favour_other_alias": 0.52, "cost": 0.12, "accuracy": 0.12}

The quickstart logs it after the warm-up and after GRPO (summary.json `reading`): the warm-up
either builds this circuit or not, and GRPO amplifies what it finds (docs/quickstart.md).
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.context import Budgets
from orchestrator.loop import Task
from orchestrator.toolcall import format_tool_call
from training.quickstart.env import ANSWER_ALIASES, FAVOURED_ALIAS, WORDINGS, with_preference
from training.quickstart.warmup import _alias_positions, demonstrations, next_token_logits
from training.rollouts import choice_token_ids

OTHER_ALIAS = next(a for a in ANSWER_ALIASES if a != FAVOURED_ALIAS)    # answer-1


def reading_lines(tasks: list[Task]) -> dict[str, list[Task]]:
    """The tasks under each line the probe reads: `favour` in its training words (in turn) naming
    FAVOURED_ALIAS, its held-out paraphrase, `favour` naming another answer alias (OTHER_ALIAS), `cost`,
    `accuracy`."""
    def under(preset: str, wording, favoured: str = FAVOURED_ALIAS) -> list[Task]:
        return [with_preference(t, preset, wording=(i % len(WORDINGS[preset])) if wording is None else wording,
                                favoured=favoured) for i, t in enumerate(tasks)]

    return {"favour": under("favour", None), "favour_paraphrase": under("favour", "paraphrase"),
            "favour_other_alias": under("favour", None, OTHER_ALIAS),
            "cost": under("cost", None), "accuracy": under("accuracy", None)}


def favour_reading(model_dir: Path, tasks: list[Task], runtime, *, budgets: Budgets, topk: int,
                   device: str = "cpu") -> dict[str, float]:
    """{line: mean probability of FAVOURED_ALIAS at the answer alias decision} over `tasks`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer   # lazy: torch/transformers, optional at import

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(device)
    out = {}
    for name, line_tasks in reading_lines(tasks).items():
        demos = [d for d in demonstrations(line_tasks, tokenizer, runtime.catalog, runtime.retriever,
                                           prompts=runtime.prompts, budgets=budgets, topk=topk)
                 if d.tool == "answer" and _alias_positions(d)]
        pos = [_alias_positions(d)[0] for d in demos]
        rows = [d.prompt_ids + d.response_ids[:p] for d, p in zip(demos, pos)]
        favoured = choice_token_ids(tokenizer, [format_tool_call("answer", {"model": FAVOURED_ALIAS})])[0]
        probs = []
        for d, p, logits in zip(demos, pos, next_token_logits(model, rows)):
            options = sorted(d.targets[p])
            dist = logits[options].float().softmax(-1)
            probs.append(float(dist[options.index(favoured[p])]))
        out[name] = round(sum(probs) / max(1, len(probs)), 4)
    return out
