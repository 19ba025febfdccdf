"""Ask an LLM for one pipeline step, check the reply, retry with the error, or drop.

Prompts live in data_synthesis/prompts/<step>.txt (string.Template, `$name` fields);
each starts with a `### STEP: <step>` line so logs and test servers can tell them apart.
A check raises `CheckFailed(reason)`; the runner sends the reason back to the model
(prompts/fix.txt) and tries again, up to `retries` times, then gives up on that item.
"""
from __future__ import annotations

import json
import re
import string
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, TypeVar

from orchestrator.gateway import LLMCallError, get_llm_response

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
T = TypeVar("T")


class CheckFailed(ValueError):
    """A reply failed a step's check; the message is fed back to the model."""


def prompt(name: str, **fields: Any) -> str:
    """Fill prompts/<name>.txt; a missing field is an error naming the file and field."""
    path = PROMPT_DIR / f"{name}.txt"
    try:
        return string.Template(path.read_text()).substitute(**fields)
    except KeyError as exc:
        raise ValueError(f"{path}: no value for ${exc.args[0]}") from None


def extract_json(text: str) -> Any:
    """The first JSON object or array in `text` (```json fences and prose around it allowed)."""
    fenced = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    body = fenced.group(1) if fenced else text
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        raise CheckFailed("no JSON object or array found in the reply; answer with JSON only")
    try:
        value, _ = json.JSONDecoder().raw_decode(body[min(starts):])
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return value


def extract_code(text: str) -> str:
    """The Python code in the reply (the first ```python fence, else the whole text)."""
    fenced = re.search(r"```(?:python|py)?\s*\n(.*?)```", text, re.DOTALL)
    return (fenced.group(1) if fenced else text).strip() + "\n"


class StepRunner:
    """Calls `LLM_CALL.get_llm_response` for steps and keeps per-step counters and cost."""

    def __init__(self, model: str, retries: int = 2, temperature: float = 0.7, max_tokens: int = 4096,
                 call: Callable[..., Any] | None = None, timeout_s: float | None = None):
        call = call or get_llm_response
        self.model, self.retries, self.temperature, self.max_tokens = model, retries, temperature, max_tokens
        self.call = call
        self.timeout_s = timeout_s      # per attempt; None = the registry entry's timeout_s
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.cost = 0.0
        self.calls = 0

    def ask(self, step: str, text: str, check: Callable[[str], T], max_tokens: int | None = None) -> T | None:
        """The checked value of the first reply that passes `check`, or None after all retries.

        `max_tokens` (completion tokens) is capped by the runner's own limit.
        Counters per step: "ok" (passed), "retried" (a failed try that was retried),
        "dropped" (every try failed), "call_error" (the LLM call itself failed).
        """
        messages = [{"role": "user", "content": text}]
        for attempt in range(1 + self.retries):
            try:
                reply = self.call(self.model, messages, temperature=self.temperature,
                                  max_tokens=min(max_tokens or self.max_tokens, self.max_tokens),
                                  **({"timeout": self.timeout_s} if self.timeout_s else {}))
            except LLMCallError as exc:
                self.counts[step]["call_error"] += 1
                self.errors[step].append(f"LLM call failed: {exc}")
                break  # the gateway already retried with backoff; do not hammer it further
            self.calls += 1
            self.cost += reply.cost
            try:
                value = check(reply.text)
            except CheckFailed as exc:
                self.errors[step].append(str(exc))
                if attempt < self.retries:
                    self.counts[step]["retried"] += 1
                    messages += [{"role": "assistant", "content": reply.text},
                                 {"role": "user", "content": prompt("fix", error=str(exc))}]
                continue
            self.counts[step]["ok"] += 1
            return value
        self.counts[step]["dropped"] += 1
        return None

    def summary(self) -> dict[str, dict[str, int]]:
        return {step: dict(sorted(c.items())) for step, c in sorted(self.counts.items())}
