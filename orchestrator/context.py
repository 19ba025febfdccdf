"""Rebuilding each turn's context (PAPER.md §1) from editable prompt files.

Every turn the orchestrator sees a fresh two-message chat: the one-line system prompt
and a user message = problem + accumulated documents + code blocks with outputs +
"choose a tool".  Budgets are in tokens:

- each document is cut to `doc_tokens`, keeping its *head* (title and lead, as
  upstream's `contents[:4000]` does);
- the documents + code part is cut to what is left of `context_tokens` after the
  problem and template, keeping its *tail* (the newest evidence).
"""
from __future__ import annotations

import functools
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
# file name -> placeholders it must use
PROMPT_FIELDS = {
    "system": set(),
    "user": {"question", "documents", "code", "evidence"},   # evidence: optional one-line tally (`evidence_line`)
    "expert_search": {"question", "context"},
    "expert_code": {"question", "context"},
    "expert_answer_boxed": {"question", "context"},
    "expert_answer_tags": {"question", "context"},
    "expert_answer_tags_brief": {"question", "context"},   # tags, shorter instruction (upstream's Llama prompt)
    "expert_answer_boxed_steps": {"question", "context"},  # \boxed{} asked in the user message (upstream training)
    "expert_direct": {"question"},
    "expert_answer_system": set(),                    # system message of boxed-style answer experts ("" = none)
    "domain_system": {"policy", "instruction"},      # function-calling (tau2) episodes
    "domain_solo_user": {"request"},
}


class PromptError(ValueError):
    """A prompt file that is missing or uses the wrong placeholders."""


PROMPT_STYLES = ("ours", "upstream-hle", "upstream-frames", "upstream-train")
UPSTREAM_PROMPTS_DIR = PROMPTS_DIR / "upstream"   # upstream/<benchmark>/: the paper profile's set


@dataclass
class Prompts:
    """The prompt templates (str.format style), loaded from a folder users edit.

    `style` says how the orchestrator's and experts' contexts are assembled around them:
    "ours" (build_messages below) or "upstream-hle" / "upstream-frames"
    (orchestrator/upstream_prompts.py: the way upstream's eval_hle.py / eval_frames.py
    build them; the paper profile's choice).
    """

    templates: dict[str, str]
    style: str = "ours"

    @classmethod
    def load(cls, folder: str | Path | None = None, style: str = "ours") -> "Prompts":
        if style not in PROMPT_STYLES:
            raise PromptError(f"prompt style {style!r}: expected one of {PROMPT_STYLES}")
        folder = Path(folder) if folder else PROMPTS_DIR
        templates = {}
        for name, required in PROMPT_FIELDS.items():
            path = folder / f"{name}.txt"
            if not path.exists():
                path = PROMPTS_DIR / f"{name}.txt"  # a custom folder may override only some files
            text = path.read_text()
            try:
                used = {f for _, f, _, _ in string.Formatter().parse(text) if f}
            except ValueError as exc:
                raise PromptError(f"{path}: bad template ({exc}); write literal braces as '{{{{' and '}}}}'") from None
            if used - required:
                raise PromptError(f"{path}: unknown placeholder(s) {sorted(used - required)}; allowed: {sorted(required)}")
            if "question" in required and "question" not in used:
                raise PromptError(f"{path}: must contain the {{question}} placeholder")
            templates[name] = text.rstrip("\n") if name in ("system", "expert_answer_system") else text
        return cls(templates, style)

    def render(self, name: str, **fields: str) -> str:
        return self.templates[name].format(**fields)


@dataclass
class Document:
    id: str
    contents: str
    source: str = "local"  # "local" index or "web" fallback


@dataclass
class CodeBlock:
    code: str
    output: str


@dataclass
class EpisodeState:
    """What the loop has gathered so far for one task."""

    question: str
    documents: list[Document] = field(default_factory=list)
    code_blocks: list[CodeBlock] = field(default_factory=list)
    task_id: str | None = None      # sent to the retriever as `eid` when the run asks for it
    files: dict[str, str] = field(default_factory=dict)   # attachments: name in the code tool's working
                                                          # folder -> host path, copied in for every run
    tool_state: dict = field(default_factory=dict)        # function tools' per-episode data (a domain's database)

    def add_documents(self, docs: list[Document], by: str = "id", merge: str = "append") -> int:
        """Add the documents not held yet, compared by `id` (ours) or `content` (upstream's);
        return how many were new.  `merge`: "append" adds them after the held ones, in the order
        given; "interleave" is upstream training's merge_documents (interleave_documents)."""
        if by not in ("id", "content"):
            raise ValueError(f"dedupe {by!r}: expected 'id' or 'content'")
        key = (lambda d: d.id) if by == "id" else (lambda d: d.contents)
        if merge == "interleave":
            before = {key(d) for d in self.documents}
            self.documents = interleave_documents(self.documents, docs, key)
            return len({key(d) for d in self.documents} - before)
        if merge != "append":
            raise ValueError(f"merge {merge!r}: expected 'append' or 'interleave'")
        seen = {key(d) for d in self.documents}
        new = []
        for d in docs:
            if key(d) not in seen:
                seen.add(key(d))
                new.append(d)
        self.documents.extend(new)
        return len(new)


def interleave_documents(held: list, new: list, key: Callable = lambda d: d) -> list:
    """Upstream training's document merge (generation_quick3.py merge_documents): with fewer
    held documents than new ones, held + new as they are; else each new document (unless its key
    is already in the result) followed by its share of len(held) // len(new) held documents
    (each unless already in), then the held documents past those shares, unchecked."""
    if not new:
        return list(held)
    if len(held) < len(new):
        return list(held) + list(new)
    share = len(held) // len(new)
    merged: list = []
    keys: set = set()

    def add(d) -> None:
        if key(d) not in keys:
            keys.add(key(d))
            merged.append(d)

    for j, d in enumerate(new):
        add(d)
        for h in held[j * share:(j + 1) * share]:
            add(h)
    return merged + list(held[share * len(new):])


@dataclass
class Budgets:
    doc_tokens: int = 1000        # ~4,000 characters
    context_tokens: int = 24000
    code_output_tokens: int = 1000


class TokenCounter:
    """Counts and cuts text in tokens of `tokenizer`, or ~4 characters per token without one.

    An episode rebuilds its context every turn from the same documents, code outputs and
    prompts, so the token ids of a text are remembered (the last `cache_size` texts): each text
    is encoded once per episode, not once per turn."""

    def __init__(self, tokenizer=None, cache_size: int = 512):
        self.tokenizer = tokenizer
        self._ids = functools.lru_cache(maxsize=cache_size)(self._encode)
        self._cut = functools.lru_cache(maxsize=cache_size)(self._cut_uncached)

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return (len(text) + 3) // 4
        return len(self._ids(text))

    def head(self, text: str, n: int) -> str:
        return self._cut(text, n, keep="head")

    def tail(self, text: str, n: int) -> str:
        return self._cut(text, n, keep="tail")

    def _cut_uncached(self, text: str, n: int, keep: str) -> str:
        if n <= 0:
            return ""
        if self.tokenizer is None:
            chars = 4 * n
            return text if len(text) <= chars else (text[:chars] if keep == "head" else text[-chars:])
        ids = self._ids(text)
        if len(ids) <= n:
            return text
        ids = ids[:n] if keep == "head" else ids[-n:]
        return self.tokenizer.decode(list(ids))


def evidence_sections(state: EpisodeState, budgets: Budgets, counter: TokenCounter) -> tuple[str, str]:
    """The documents and code sections, each document/output cut to its own budget."""
    docs = "".join(
        f"Document {i + 1} (id {d.id}{', web' if d.source == 'web' else ''}):\n"
        f"{counter.head(d.contents, budgets.doc_tokens)}\n\n"
        for i, d in enumerate(state.documents))
    code = "".join(
        f"Code {i + 1}:\n```python\n{c.code}\n```\nOutput:\n{counter.tail(c.output, budgets.code_output_tokens)}\n\n"
        for i, c in enumerate(state.code_blocks))
    return (f"Documents:\n{docs}" if docs else ""), (f"Code results:\n{code}" if code else "")


def evidence_line(state: EpisodeState) -> str:
    """A one-line tally of the evidence gathered so far, for prompts that use `{evidence}`:
    "Evidence so far: none." / "Evidence so far: 2 documents, 1 code result." (a small policy that
    reads mostly the prompt's last tokens then still sees whether a tool has run)."""
    parts = [f"{n} {what}{'s' if n != 1 else ''}" for n, what in
             ((len(state.documents), "document"), (len(state.code_blocks), "code result")) if n]
    return f"Evidence so far: {', '.join(parts) or 'none'}."


def fit_tail(documents: str, code: str, room: int, counter: TokenCounter) -> tuple[str, str]:
    """Cut documents+code to `room` tokens keeping the tail: code (newest) survives longest."""
    code_tokens = counter.count(code)
    if code_tokens >= room:
        return "", counter.tail(code, room)
    return counter.tail(documents, room - code_tokens), code


def build_messages(state: EpisodeState, prompts: Prompts, budgets: Budgets,
                   counter: TokenCounter) -> list[dict[str, str]]:
    """The orchestrator's two-message chat for this turn, within `budgets.context_tokens`, in this
    project's prompt style (orchestrator/prompt_style.py picks between it and upstream's)."""
    documents, code = evidence_sections(state, budgets, counter)
    system = prompts.render("system")
    evidence = evidence_line(state)
    fixed = counter.count(system) + counter.count(prompts.render("user", question=state.question, documents="", code="",
                                                                 evidence=evidence))
    documents, code = fit_tail(documents, code, budgets.context_tokens - fixed, counter)
    user = prompts.render("user", question=state.question, documents=documents, code=code, evidence=evidence)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def expert_context(state: EpisodeState, budgets: Budgets, counter: TokenCounter, room: int | None = None) -> str:
    """Documents and code results as one block for an expert's prompt (tail kept)."""
    documents, code = evidence_sections(state, budgets, counter)
    documents, code = fit_tail(documents, code, room or budgets.context_tokens, counter)
    return documents + code
