"""Kind `answer`: the alias's expert answers; a call that succeeds ends the episode."""
from __future__ import annotations

from typing import Literal

from orchestrator.extract import answer_style, extract_answer
from orchestrator.tools.registry import AliasKind, register
from orchestrator.tools.spec import AliasToolSpec


class Spec(AliasToolSpec):
    kind: Literal["answer"]


@register
class Answer(AliasKind):
    name = "answer"
    spec = Spec
    qa = True
    ends_episode = True

    def run(self, runtime, call, state, catalog):
        fmt = runtime.expert(call.model, tool=call.tool).answer_format
        if fmt == "auto":
            fmt = answer_style(runtime.served(call.model))
        name = f"expert_answer_{fmt}"
        system = runtime.prompts.render("expert_answer_system").strip() if fmt == "boxed" else ""
        reply = runtime._ask_expert(call, runtime.prompts.render(
            name, question=state.question, context=runtime._context(state, call)), catalog, system=system)
        call.output, call.reply = reply[:2000], reply
        if runtime.prompts.style.startswith("upstream"):
            from orchestrator.upstream_prompts import extract_answer_upstream
            return extract_answer_upstream(reply, "boxed" if fmt in ("boxed", "boxed_steps") else "tags")
        return extract_answer(reply)
