"""Does a policy read the favour line?  The favoured alias's probability at the answer turn.

For held-out tasks, the answer turn as the loop shows it (the evidence tool's result in context,
`warmup.demonstrations`), under each preference line: the policy's next-token distribution at the
answer alias decision, restricted to the answer aliases (teacher-forced, no sampling), and the
mean probability of `FAVOURED_ALIAS` there.  A policy that reads the line gives it more under
`favour` than under the other lines; `favour_other_alias` (the line naming answer-1) says whether it
reads *which* alias the line names (training lines name answer-4 alone by default, so it need not).

    reading = favour_reading(model_dir, tasks, runtime, budgets=..., topk=...)
    # {"favour": 0.57, "favour_paraphrase": 0.57, "favour_other_alias": 0.57, "cost": 0.13,
    #  "cost_paraphrase": ..., "accuracy": 0.12, "accuracy_paraphrase": ...}
    separation(reading)   # 0.44: favour's lift over the larger of cost and accuracy (training words;
                          # validation=True: the smaller of that and the validation lines' lift)

The quickstart logs it after the warm-up and after GRPO (summary.json `reading`): the warm-up
either builds this circuit or not, and GRPO amplifies what it finds (docs/quickstart.md); on the
warm-up's own tasks, `separation` decides whether the warm-up is tried again (warm_start.warm_up).
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.context import Budgets
from orchestrator.loop import Task
from orchestrator.toolcall import format_tool_call
from training.quickstart.env import (
    ANSWER_ALIASES,
    FAVOURED_ALIAS,
    WORDINGS,
    with_preference,
)
from training.quickstart.warmup import (
    _alias_positions,
    demonstrations,
    next_token_logits,
)
from training.rollouts import choice_token_ids

OTHER_ALIAS = next(a for a in ANSWER_ALIASES if a != FAVOURED_ALIAS)    # answer-1


def reading_lines(tasks: list[Task]) -> dict[str, list[Task]]:
    """The tasks under each line the probe reads: `favour` in its training words (in turn) naming
    FAVOURED_ALIAS, its held-out paraphrase, `favour` naming another answer alias (OTHER_ALIAS), `cost`
    and `accuracy` in their training words and in their paraphrases, and each preset's validation
    line (env.VALIDATION_LINES: the warm-up probe's unfamiliar words)."""
    def under(preset: str, wording, favoured: str = FAVOURED_ALIAS) -> list[Task]:
        return [with_preference(t, preset, wording=(i % len(WORDINGS[preset])) if wording is None else wording,
                                favoured=favoured) for i, t in enumerate(tasks)]

    return {"favour": under("favour", None), "favour_paraphrase": under("favour", "paraphrase"),
            "favour_other_alias": under("favour", None, OTHER_ALIAS),
            "cost": under("cost", None), "cost_paraphrase": under("cost", "paraphrase"),
            "accuracy": under("accuracy", None), "accuracy_paraphrase": under("accuracy", "paraphrase"),
            **{f"{p}_validation": under(p, "validation") for p in ("favour", "cost", "accuracy")}}


def favour_reading(model_dir: Path, tasks: list[Task], runtime, *, budgets: Budgets, topk: int,
                   device: str = "cpu", lines: tuple[str, ...] | None = None) -> dict[str, float]:
    """{line: mean probability of FAVOURED_ALIAS at the answer alias decision} over `tasks`, for
    every line of `reading_lines` (or those named in `lines`)."""
    from transformers import (  # lazy: torch/transformers, optional at import
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(device)
    out = {}
    for name, line_tasks in reading_lines(tasks).items():
        if lines is not None and name not in lines:
            continue
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


def separation(reading: dict[str, float], validation: bool = False) -> float:
    """How far the favour line lifts FAVOURED_ALIAS above the other preferences' lines:
    P(favour) - max(P(cost), P(accuracy)) in the training words and, with `validation` where
    `reading` has them, in the validation lines (the smaller of the two lifts): a start that reads
    the training words but sends any unfamiliar sentence to FAVOURED_ALIAS, or none, does not separate."""
    lifts = [reading["favour"] - max(reading["cost"], reading["accuracy"])]
    if validation and "favour_validation" in reading:
        lifts.append(reading["favour_validation"] - max(reading["cost_validation"], reading["accuracy_validation"]))
    return round(min(lifts), 4)
