"""Judging a QA prediction the way ToolOrchestra's HLE/FRAMES scripts do (PAPER.md §8).

Rules, in order:
1. an empty prediction, or one of more than 500 words, is wrong;
2. a case-insensitive exact match with the reference (after stripping) is right;
3. otherwise an LLM judge (any LLM_CALL model) reads the prompt file and answers True/False.

Two judge styles: "lenient" (orchestrator/prompts/judge.txt; the last True/False word of the
reply decides) and "upstream" (the paper profile: upstream's prompt from eval_hle.py line
276-279, orchestrator/prompts/judge_upstream.txt, and only `<correct>True|False</correct>`
decides).  A reply neither style can read is a judge error (`correct` None, rule
"llm_unparsed"), recorded as such and never counted as a wrong answer.  A third style,
"upstream-train", is upstream's *training* judge (generation_quick3.py 431-445, the paper
profile's `qa.train.judge`): the same prompt (orchestrator/prompts/judge_upstream_train.txt, from
lines 436-439) at temperature 1, rule 1's words counted as `pred.split(' ')`, and the reply read
exactly as training read it: True only when the text after the last `<correct>` up to the next
`</correct>` (the whole reply without a tag) is "true" in any case, unstripped; anything else is
False, never a judge error.

A fourth style, "hle", is Humanity's Last Exam's official judge (centerforaisafety/hle
hle_eval/run_judge_results.py, docs/evaluation.md "HLE's official judge"): HLE's prompt verbatim
(orchestrator/prompts/judge_hle.txt, placeholders {question}, {response}, {correct_answer}), one
user message, no temperature, 4,096 completion tokens (the profile's `judges.hle`), and OpenAI
structured output (`response_format` json_schema `ExtractedAnswer`: extracted_final_answer,
reasoning, correct "yes"/"no", confidence, strict).  It applies none of rules 1-2 (HLE sends
every response to the judge) and reads the model's whole answer text, so a stated "Confidence: X%"
reaches it.  A reply that is not that object is a judge error.  With a rule judge name ("exact",
"contains") it fills the same object by rules (the "Answer:" line, the "Confidence: X%" line) and
reads it through the same parser: the stand-in for o3-mini where no key is at hand.

Two judge names need no model, for runs where no capable judge is at hand (the embedded
default's 135M model cannot judge): "exact" stops after rules 1-2 (anything else is wrong),
"contains" then accepts a prediction holding the reference as a whole word or phrase
(rule "contains"). Neither is the paper's judge; the run's record says which one decided.
A third, "gaia", is GAIA's official quasi-exact match (evaluation/scoring/gaia.py, ported from
the GAIA leaderboard's scorer.py) and nothing else: rules 1-2 do not apply (rule "gaia" /
"not_gaia").  A task without a reference (GAIA's test split, answer "?") gets no verdict
(`correct` None, rule "no_reference"): it is answered, not judged, and not an error.

The verdict keeps which rule decided and the judge's raw reply, so a run can be re-judged
or audited later.  The judge's own tokens are priced like any call but kept apart from the
orchestrator's cost: the paper's cost per query does not include grading.
"""
from __future__ import annotations

import json
import re
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from evaluation.scoring.gaia import question_scorer
from orchestrator.context import PROMPTS_DIR
from orchestrator.gateway import get_llm_response
from orchestrator.records import LLMResponse, Usage

DEFAULT_JUDGE_PROMPT = PROMPTS_DIR / "judge.txt"
UPSTREAM_JUDGE_PROMPT = PROMPTS_DIR / "judge_upstream.txt"
UPSTREAM_TRAIN_JUDGE_PROMPT = PROMPTS_DIR / "judge_upstream_train.txt"
HLE_JUDGE_PROMPT = PROMPTS_DIR / "judge_hle.txt"
JUDGE_STYLES = ("lenient", "upstream", "upstream-train", "hle")
_STYLE_PROMPTS = {"lenient": DEFAULT_JUDGE_PROMPT, "upstream": UPSTREAM_JUDGE_PROMPT,
                  "upstream-train": UPSTREAM_TRAIN_JUDGE_PROMPT, "hle": HLE_JUDGE_PROMPT}
_CORRECT_RE = re.compile(r"<correct>\s*(true|false)\s*</correct>", re.IGNORECASE)
MAX_ANSWER_WORDS = 500
_PLACEHOLDERS = {"question", "reference", "prediction"}
_HLE_PLACEHOLDERS = {"question", "response", "correct_answer"}   # HLE's own names, kept with its text
_VERDICT_RE = re.compile(r"\b(true|false)\b", re.IGNORECASE)
RULE_JUDGES = ("exact", "contains", "gaia")   # judge names that call no model


class JudgeError(RuntimeError):
    """The LLM judge could not be reached or its prompt file is unusable."""


@dataclass
class Verdict:
    """`correct` and why: rule in {"empty", "too_long", "exact", "llm", "llm_unparsed"}, or with a
    rule judge {"not_exact", "contains", "not_contained", "gaia", "not_gaia"}, or "no_reference"."""

    correct: bool | None              # None: the judge's reply could not be read (a judge error), or
                                      # rule "no_reference": nothing to judge against
    rule: str
    raw: str | None = None            # the judge's reply, verbatim
    # the "hle" judge: its structured reply's fields (extracted_final_answer, reasoning, correct,
    # confidence, strict) and the confidence (0-100) it extracted from the answer (HLE's calibration)
    structured: dict[str, Any] | None = None
    confidence: int | None = None
    judge_model: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0                 # dollars spent on judging (not part of the run's cost)
    latency: float = 0.0              # seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_judge_prompt(path: str | Path | None = None, style: str = "lenient") -> str:
    """Read and check the judge template: it must use {question}, {reference}, {prediction}
    (the "hle" style: HLE's {question}, {response}, {correct_answer})."""
    path = Path(path) if path else _STYLE_PROMPTS[style]
    wanted = _HLE_PLACEHOLDERS if style == "hle" else _PLACEHOLDERS
    try:
        text = path.read_text()
    except OSError as exc:
        raise JudgeError(f"judge prompt {path}: cannot read: {exc.strerror}") from None
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(text) if name}
    except ValueError as exc:
        raise JudgeError(f"judge prompt {path}: bad template ({exc}); write literal braces as '{{{{' '}}}}'") from None
    if used != wanted:
        raise JudgeError(f"judge prompt {path}: placeholders {sorted(used)}; it must use exactly {sorted(wanted)}"
                         + (" (the hle judge style)" if style == "hle" else ""))
    return text


def rule_verdict(prediction: str | None, reference: str) -> Verdict | None:
    """The verdict of rules 1-2, or None when the LLM judge must decide."""
    pred = (prediction or "").strip()
    if not pred:
        return Verdict(False, "empty")
    if len(pred.split()) > MAX_ANSWER_WORDS:
        return Verdict(False, "too_long")
    if pred.lower() == reference.strip().lower():
        return Verdict(True, "exact")
    return None


def rule_verdict_train(prediction: str | None, reference: str) -> Verdict | None:
    """Rules 1-2 as upstream's training applies them (generation_quick3.py 431-434): words are
    `pred.split(' ')` (a run of spaces counts empty words; newlines split nothing)."""
    pred = prediction or ""
    if pred.strip() == "":
        return Verdict(False, "empty")
    if len(pred.split(" ")) > MAX_ANSWER_WORDS:
        return Verdict(False, "too_long")
    if pred.strip().lower() == reference.strip().lower():
        return Verdict(True, "exact")
    return None


def parse_upstream_train_reply(text: str) -> bool:
    """generation_quick3.py 441-445: the text after the last `<correct>` up to the next
    `</correct>` (the whole reply when it has no tag), lower-cased and compared with 'true'
    unstripped; anything else is False."""
    return (text or "").split("<correct>")[-1].split("</correct>")[0].lower() == "true"


def parse_judge_reply(text: str) -> bool | None:
    """True/False from the judge's reply (the last True/False word wins: models reason first)."""
    words = _VERDICT_RE.findall(text or "")
    return words[-1].lower() == "true" if words else None


def parse_upstream_reply(text: str) -> bool | None:
    """True/False from `<correct>...</correct>` (the last one), or a reply that is exactly
    True/False (upstream took the whole reply when it had no tag); None otherwise (upstream
    counted any such reply as False; we record it as a judge error)."""
    found = _CORRECT_RE.findall(text or "")
    if found:
        return found[-1].lower() == "true"
    bare = (text or "").strip().lower()
    return {"true": True, "false": False}.get(bare)


# HLE's judge reply (run_judge_results.py 35-40): same name, fields and types and no docstring
# (it would become the schema's description), so the JSON schema below is the one HLE's
# `beta.chat.completions.parse(response_format=ExtractedAnswer)` sends (tests/fixtures/hle/judge.json).
class ExtractedAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    extracted_final_answer: str
    reasoning: str
    correct: Literal["yes", "no"]
    confidence: int
    strict: Literal[True]


# OpenAI structured output: the schema in strict mode (every field required, no other field).
HLE_RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {
    "schema": {**ExtractedAnswer.model_json_schema(), "additionalProperties": False},
    "name": "ExtractedAnswer", "strict": True}}
_ANSWER_LINE_RE = re.compile(r"^\s*\**answer\**\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_CONFIDENCE_RE = re.compile(r"confidence\**\s*(?:score)?\s*[:=]?\s*(\d{1,3}(?:\.\d+)?)\s*%", re.IGNORECASE)


def parse_hle_reply(text: str) -> dict[str, Any] | None:
    """The structured reply's fields, or None when it is not HLE's object (not JSON, a field
    missing, extra or of the wrong type: a judge error, never a wrong answer)."""
    try:
        return ExtractedAnswer.model_validate_json(text or "").model_dump()
    except ValidationError:
        return None


def hle_rule_reply(response: str, reference: str, rule: str) -> str:
    """The stand-in for HLE's judge model with a rule judge ("exact" / "contains"): the same JSON
    object, filled by rules from HLE's answer format (the last "Answer:" line, else the whole
    response; the last "Confidence: X%", else 100 as HLE's prompt says)."""
    lines = _ANSWER_LINE_RE.findall(response or "")
    extracted = lines[-1].strip() if lines else (response or "").strip()
    said = _CONFIDENCE_RE.findall(response or "")
    confidence = min(100, round(float(said[-1]))) if said else 100
    ref = reference.strip().lower()
    if rule == "exact":
        right = extracted.lower() == ref
    else:
        right = re.search(rf"(?<!\w){re.escape(ref)}(?!\w)", extracted.lower()) is not None
    return json.dumps({"extracted_final_answer": extracted or "None",
                       "reasoning": f"rule judge {rule!r} (no model): the extracted answer "
                                    f"{'matches' if right else 'does not match'} the correct answer",
                       "correct": "yes" if right else "no", "confidence": confidence, "strict": True})


def _default_call() -> Callable[..., LLMResponse]:
    return get_llm_response


class Judge:
    """Applies the rules, then asks `model` through LLM_CALL (or `call`, same signature)."""

    def __init__(self, model: str, prompt_path: str | Path | None = None,
                 call: Callable[..., LLMResponse] | None = None, max_tokens: int = 2048, style: str = "lenient"):
        if style not in JUDGE_STYLES:
            raise JudgeError(f"judge style {style!r}: expected one of {JUDGE_STYLES}")
        self.model = model
        self.style = style
        self.template = load_judge_prompt(prompt_path, style)   # checked even for rule judges: fail early
        self._call = call
        self.max_tokens = max_tokens   # reasoning judges (GPT-5) spend most of it thinking

    def __call__(self, question: str, prediction: str | None, reference: str | None,
                 response: str | None = None) -> Verdict:
        """`response`: the model's whole answer text (the "hle" style reads it, as HLE's judge
        reads the model's response; default: the prediction); other styles read `prediction`."""
        if reference is None:   # nothing to judge against (GAIA's test split): no verdict, no error
            return Verdict(None, "no_reference", judge_model=self.model)
        if self.model == "gaia":
            right = question_scorer(prediction, reference)
            return Verdict(right, "gaia" if right else "not_gaia", judge_model="gaia")
        if self.style == "hle":
            return self._hle(question, prediction if response is None else response, reference)
        verdict = (rule_verdict_train if self.style == "upstream-train" else rule_verdict)(prediction, reference)
        if verdict is not None:
            return verdict
        if self.model == "exact":
            return Verdict(False, "not_exact", judge_model="exact")
        if self.model == "contains":
            found = re.search(rf"(?<!\w){re.escape(reference.strip().lower())}(?!\w)", prediction.lower())
            return Verdict(found is not None, "contains" if found else "not_contained", judge_model="contains")
        shown = prediction if self.style == "upstream-train" else prediction.strip()   # gq3:437: pred as extracted
        prompt = self.template.format(question=question, reference=reference, prediction=shown)
        call = self._call or _default_call()
        try:
            reply = call(self.model, [{"role": "user", "content": prompt}],
                         temperature=0.0 if self.style == "lenient" else 1.0, max_tokens=self.max_tokens)
        except Exception as exc:  # LLMCallError after bounded retries, or a bad config
            raise JudgeError(f"judge {self.model!r} failed: {type(exc).__name__}: {exc}") from exc
        decided = {"lenient": parse_judge_reply, "upstream": parse_upstream_reply,
                   "upstream-train": parse_upstream_train_reply}[self.style](reply.text)
        return Verdict(correct=decided, rule="llm" if decided is not None else "llm_unparsed",
                       raw=reply.text, judge_model=self.model, usage=reply.usage,
                       cost=reply.cost, latency=reply.latency)

    def _hle(self, question: str, response: str | None, reference: str) -> Verdict:
        """HLE's judge (run_judge_results.py 44-53): one user message, `max_completion_tokens`
        (the gateway's name for an OpenAI model), no temperature, structured output."""
        if self.model in ("exact", "contains"):
            reply = LLMResponse(model=self.model, text=hle_rule_reply(response or "", reference, self.model))
        else:
            prompt = self.template.format(question=question, correct_answer=reference, response=response or "")
            call = self._call or _default_call()
            try:
                reply = call(self.model, [{"role": "user", "content": prompt}], temperature=None,
                             max_tokens=self.max_tokens, response_format=HLE_RESPONSE_FORMAT)
            except Exception as exc:  # LLMCallError after bounded retries, or a bad config
                raise JudgeError(f"judge {self.model!r} failed: {type(exc).__name__}: {exc}") from exc
        fields = parse_hle_reply(reply.text)
        rule = self.model if self.model in ("exact", "contains") else "llm"
        return Verdict(correct=None if fields is None else fields["correct"] == "yes",
                       rule=rule if fields is not None else "llm_unparsed", raw=reply.text,
                       structured=fields, confidence=None if fields is None else fields["confidence"],
                       judge_model=self.model, usage=reply.usage, cost=reply.cost, latency=reply.latency)
