"""Contexts assembled the way upstream's evaluation scripts assemble them (the paper profile).

NVIDIA's released orchestrator was trained and evaluated on these exact strings, so under
the paper profile it must see them again.  Sources (NVlabs/ToolOrchestra at 3d29bed):
- orchestrator turn: evaluation/eval_hle.py lines 430-476, eval_frames.py lines 483-526, and in
  training training/lead_agent/llm_agent/generation_quick3.py lines 1105-1135;
- expert contexts: eval_hle.py lines 536-651 (per expert family: context and code budgets,
  documents cut to 1,000 characters for the small open models);
- answer extraction: eval_hle.py lines 202-207 (boxed) and 238-242, 265-269 (tags).
The templates around these contexts are files in orchestrator/prompts/upstream/<benchmark>/.
Token cuts keep the tail, as upstream's `cut_seq` does, with the run's TokenCounter.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.context import UPSTREAM_PROMPTS_DIR, EpisodeState, TokenCounter, evidence_line


@dataclass(frozen=True)
class OrchestratorContext:
    """Upstream's orchestrator-context constants for one benchmark."""

    doc_chars: int            # each document cut to this many characters
    doc_suffix: str           # written after each (cut) document
    code_tokens: int          # code blocks + outputs: tail kept
    context_tokens: int       # documents + code: tail kept
    minus_question: bool      # the question's tokens come off context_tokens
    always_code_header: bool  # the code header written even with no code
    code_header: str = "\npython code and execution outputs:\n"   # between documents and code


VARIANTS = {
    # eval_hle.py 431-454: doc[:1200] + " ...", code cut to 12,000, total 27,000 minus the problem
    "upstream-hle": OrchestratorContext(1200, " ...", 12000, 27000, True, False),
    # eval_frames.py 484-503: doc[:4000], code cut to 12,000, total 24,000
    "upstream-frames": OrchestratorContext(4000, "", 12000, 24000, False, True),
    # generation_quick3.py 1105-1135 (training): doc[:4000], code cut to 16,000, total 24,000, no header
    "upstream-train": OrchestratorContext(4000, "", 16000, 24000, False, False, ""),
}


def _code_str(state: EpisodeState) -> str:
    return "".join(f"```python\n{c.code}\n```\n\n```output\n{c.output}\n```\n\n" for c in state.code_blocks)


def _cut_code(code: str, tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """Tail of `code` within `tokens`, re-opened with ``` when the cut lands mid-block; and its full length."""
    length = counter.count(code) if code else 0
    cut = counter.tail(code, tokens) if code else ""
    if cut and not cut.startswith("```"):
        cut = "```\n" + cut
    return cut, length


def orchestrator_context(state: EpisodeState, variant: str, counter: TokenCounter) -> str:
    """The `{context_str}` of upstream's orchestrator prompt for this turn."""
    v = VARIANTS[variant]
    doc_str = "".join(f"Doc {i + 1}: {d.contents[:v.doc_chars]}{v.doc_suffix}\n\n"
                      for i, d in enumerate(state.documents))
    code, code_len = _cut_code(_code_str(state), v.code_tokens, counter)
    room = v.context_tokens - (counter.count(state.question) if v.minus_question else 0)
    if code_len >= room:
        return code
    seq = doc_str + v.code_header + code if (code or v.always_code_header) else doc_str
    context = counter.tail(seq, room) if seq else ""
    return "Documents:\n" + context if doc_str else context


def build_messages_upstream(state: EpisodeState, prompts, budgets, counter: TokenCounter) -> list[dict[str, str]]:
    """The orchestrator's chat as upstream builds it: system prompt + one user message."""
    context = orchestrator_context(state, prompts.style, counter)
    user = prompts.render("user", question=state.question, documents=context, code="", evidence=evidence_line(state))
    return [{"role": "system", "content": prompts.render("system")}, {"role": "user", "content": user}]


def expert_context_upstream(state: EpisodeState, settings, counter: TokenCounter) -> str:
    """An expert's context as upstream builds it (documents + code, tail kept), already stripped."""
    cut = settings.doc_chars
    doc_str = "".join(f"Doc {i + 1}: {d.contents[:cut] if cut else d.contents}\n\n"
                      for i, d in enumerate(state.documents))
    code, _ = _cut_code(_code_str(state), settings.code_tokens, counter)
    room = settings.context_tokens - (counter.count(state.question) if settings.context_minus_question else 0)
    context = counter.tail(doc_str + code, room)
    if doc_str:
        context = "Documents:\n" + context
    return context.strip()


def extract_answer_upstream(text: str, answer_format: str) -> str:
    """Upstream's extraction: boxed -> after the last `\\boxed{` up to the last `}` ('' without
    a box: no fallback); tags -> between the last `<answer>` and the next `</answer>`."""
    text = text or ""
    if answer_format == "boxed":
        if "\\boxed{" not in text:
            return ""
        return "}".join(text.split("\\boxed{")[-1].split("}")[:-1]).strip()
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def tool_schemas_upstream(catalog, tools, schema_file=None) -> list[dict]:
    """The function schemas as upstream's evaluation/tools.json writes them: upstream's tool
    order and wording (orchestrator/prompts/upstream/schemas.json), "Choices: [...]" after the
    first sentence, then the alias table from the catalog's prices and latencies.  Tools the
    file does not describe are rendered the project's way, after the others."""
    spec = json.loads(Path(schema_file or UPSTREAM_PROMPTS_DIR / "schemas.json").read_text())
    known = {t.name: t for t in tools if t.name in spec["tools"]}
    out = []
    for name in spec["order"]:
        if name not in known:
            continue
        tool, text = known[name], spec["tools"][name]
        rows = ["Model | price per million input tokens | price per million output tokens | average latency"]
        for alias, a in tool.aliases.items():
            p = catalog.price(a.model)
            rows.append(f"{alias} | ${p.input:g} | ${p.output:g} | {a.latency_s:g}s")
        desc = f"{text['lead']} Choices: {list(tool.aliases)}. {text['text']}\n" + "\n".join(rows)
        out.append({"type": "function", "function": {
            "name": name, "description": text["description"],
            "parameters": {"properties": {"model": {"description": desc, "type": "string"}},
                           "required": ["model"], "title": "parameters", "type": "object"}}})
    rest = [t for t in tools if t.name not in known]
    return out + (catalog.openai_tools(tools=rest) if rest else [])
