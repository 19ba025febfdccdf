"""Kind `code` (the paper's enhance_reasoning): the alias's expert writes Python, the sandbox runs it."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from orchestrator.context import CodeBlock
from orchestrator.extract import extract_code, split_code
from orchestrator.tools.registry import AliasKind, register
from orchestrator.tools.spec import AliasToolSpec

# Code fee per sandbox run (settings `costs.code_fee`): "seconds" charges its wall time at
# fees.code_per_second (the paper's price); "none" nothing.  Wall time differs run to run and
# machine to machine: where every correct rollout of a group made the same calls, the group's
# min-max normalisation turns that microsecond noise into the whole [0, 1] cost coordinate.
CODE_FEES = ("seconds", "none")


class Spec(AliasToolSpec):
    kind: Literal["code"]


@register
class Code(AliasKind):
    name = "code"
    spec = Spec
    qa = True

    def run(self, runtime, call, state, catalog):
        code_settings = runtime.qa.code
        reply = runtime._ask_expert(call, runtime.prompts.render(
            "expert_code", question=state.question, context=runtime._context(state, call)), catalog)
        if code_settings.extraction == "none":
            call.output = "no code run (code.extraction: none)"
            return None
        code = extract_code(reply) if code_settings.extraction == "ours" else split_code(reply)
        if code is None or (code == "" and code_settings.extraction == "upstream"):   # upstream skips an empty one
            call.output = "the expert wrote no ```python block"
            return None
        # a task's attachments (GAIA) are copied next to the code: it opens them by name
        attached = {"files": {name: Path(path) for name, path in state.files.items()}} if state.files else {}
        result = runtime.run_code(code, code_settings.timeout, **attached)
        if runtime.qa.costs.code_fee == "seconds":
            call.cost += catalog.code_cost(result.duration_s)
        if code_settings.output == "stdout":
            output = result.stdout
        else:
            output = (result.stdout if result.exit_code == 0
                      else f"{result.stdout}\n[exit {result.exit_code}] {result.stderr[-1000:]}")
            if result.timed_out:
                output += f"\n[timed out after {code_settings.timeout:g} s]"
        if output.strip() or code_settings.keep_empty:   # upstream keeps its stdout as printed
            state.code_blocks.append(CodeBlock(code=code, output=output.strip() if code_settings.output == "full" else output))
        call.output = output.strip()[:2000]
        return None
