"""The one prompt renderer: chat messages + tool schemas -> the prompt text and token ids a
local model reads.  Training (`TokenPolicy`), the gateway's in-process transformers backend
(`run_hle.py`, `run_frames.py`, `run_tau2.py` on a local checkpoint) and the quickstart's
warm-up all render through `prompt_ids`, so a checkpoint is evaluated on the exact prompt
format it was trained on (tests/orchestrator/test_chat_template.py compares the ids).

Templates that ignore `tools` (e.g. SmolLM2's) get the hermes tool block written into the
system message, as Qwen's template writes it; the ids are the text tokenized without extra
special tokens (as vLLM does).
"""
from __future__ import annotations

import json

_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one of the functions below to make progress.\n"
    "Function signatures are inside <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "Call a function by returning a JSON object with its name and arguments inside "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None) -> str:
    """Chat-template text with tools and the generation prompt."""
    template = tokenizer.chat_template or ""
    if tools and "tools" not in template:
        block = _TOOLS_HEADER.format(tools="\n".join(json.dumps(t) for t in tools))
        if messages and messages[0].get("role") == "system":
            messages = [{**messages[0], "content": (messages[0].get("content") or "") + block}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": block.lstrip("\n")}, *messages]
        tools = None
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """`render_prompt`'s text as token ids, without extra special tokens (as vLLM tokenizes it)."""
    return list(tokenizer(render_prompt(tokenizer, messages, tools), add_special_tokens=False)["input_ids"])


def cut_middle(ids: list[int], limit: int) -> list[int]:
    """At most `limit` ids: the first limit // 2 and the last limit - limit // 2 (the middle goes).

    Upstream's training cuts its templated prompt so (verl's postprocess_data, truncation='middle',
    at data.max_prompt_length=24000): the template's head (system prompt, tools, the problem) and
    the newest context survive, the oldest documents after the problem go."""
    if limit <= 0:
        raise ValueError(f"cut_middle: limit must be positive, got {limit}")
    if len(ids) <= limit:
        return list(ids)
    left = limit // 2
    return list(ids[:left]) + list(ids[len(ids) - (limit - left):])
