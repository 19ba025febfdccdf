"""The `hle` judge: HLE's official judge (centerforaisafety/hle hle_eval/run_judge_results.py).

tests/fixtures/hle/judge.json records, from HLE's file at 87c92ea: the JUDGE_PROMPT literal as
written in the source, and the `response_format` that HLE's
`client.beta.chat.completions.parse(response_format=ExtractedAnswer)` sends (made by the openai
SDK from HLE's own class).  Our prompt file and request must equal them.
"""
from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from evaluation.scoring.judge import (HLE_RESPONSE_FORMAT, Judge, JudgeError, hle_rule_reply, load_judge_prompt,
                                      parse_hle_reply)
from orchestrator.records import LLMResponse, Usage

REPO = Path(__file__).resolve().parents[3]
FIXTURE = json.loads((REPO / "tests" / "fixtures" / "hle" / "judge.json").read_text())
PROMPT_FILE = REPO / "orchestrator" / "prompts" / "judge_hle.txt"
GOOD = {"extracted_final_answer": "Tokyo", "reasoning": "same city", "correct": "yes", "confidence": 85,
        "strict": True}


def test_prompt_file_is_hles_prompt_byte_for_byte():
    # the literal as HLE's source writes it, evaluated as Python does (its `\%` stays a backslash)
    expected = ast.literal_eval(FIXTURE["prompt_literal"])
    assert PROMPT_FILE.read_bytes() == expected.encode()
    assert hashlib.sha256(PROMPT_FILE.read_bytes()).hexdigest() == FIXTURE["prompt_sha256"]
    assert "0|\\%| and 100|\\%|" in expected and "if there if there is" in expected   # HLE's text, typos kept


def test_response_format_is_what_hles_parse_call_sends():
    assert HLE_RESPONSE_FORMAT == FIXTURE["response_format"]


def test_prompt_placeholders_are_hles_and_checked(tmp_path):
    assert load_judge_prompt(style="hle") == PROMPT_FILE.read_text()
    ours = tmp_path / "judge.txt"
    ours.write_text("{question} {prediction} {reference}")
    with pytest.raises(JudgeError, match="correct_answer.*the hle judge style"):
        load_judge_prompt(ours, style="hle")


def _judge(reply_text: str, seen: list, model: str = "o3-mini") -> Judge:
    def call(model, messages, **kw):
        seen.append((model, messages, kw))
        return LLMResponse(model=model, text=reply_text, usage=Usage(900, 60), cost=0.0012, latency=1.5)
    return Judge(model, call=call, style="hle", max_tokens=4096)


def test_request_is_one_user_message_without_temperature_and_with_the_schema():
    seen = []
    v = _judge(json.dumps(GOOD), seen)("Capital of Japan?", "Tokyo", "Tokyo",
                                       response="Explanation: known.\nAnswer: Tokyo\nConfidence: 85%")
    model, messages, kw = seen[0]
    assert model == "o3-mini"
    assert messages == [{"role": "user", "content": PROMPT_FILE.read_text().format(
        question="Capital of Japan?", correct_answer="Tokyo",
        response="Explanation: known.\nAnswer: Tokyo\nConfidence: 85%")}]
    assert kw == {"temperature": None, "max_tokens": 4096, "response_format": FIXTURE["response_format"]}
    assert (v.correct, v.rule, v.confidence, v.structured) == (True, "llm", 85, GOOD)
    assert (v.judge_model, v.usage, v.cost) == ("o3-mini", Usage(900, 60), 0.0012)


def test_no_rule_short_circuits_the_judge():
    """HLE sends every response to its judge: an exact match, an empty or a long answer included."""
    seen = []
    judge = _judge(json.dumps({**GOOD, "correct": "no", "confidence": 100}), seen)
    for prediction in ("Tokyo", "", None, "word " * 600):
        assert judge("q", prediction, "Tokyo").rule == "llm"
    assert len(seen) == 4
    assert "[response]: \n" in seen[2][1][0]["content"]       # None: an empty response


@pytest.mark.parametrize("reply", [
    "",                                                          # nothing (e.g. a refusal: content null)
    "yes",                                                       # not JSON
    json.dumps({k: v for k, v in GOOD.items() if k != "confidence"}),   # a field missing
    json.dumps({**GOOD, "correct": "maybe"}),                    # outside yes/no
    json.dumps({**GOOD, "correct": True}),
    json.dumps({**GOOD, "confidence": "high"}),                  # not an integer
    json.dumps({**GOOD, "strict": False}),
    json.dumps({**GOOD, "extra": 1}),                            # not the schema's object
    json.dumps([GOOD]),
])
def test_a_malformed_reply_is_a_judge_error_not_a_wrong_answer(reply):
    v = _judge(reply, [])("q", "Tokyo", "Tokyo")
    assert (v.correct, v.rule, v.confidence, v.structured, v.raw) == (None, "llm_unparsed", None, None, reply)
    assert parse_hle_reply(reply) is None


def test_a_reply_saying_no_is_wrong_with_its_confidence():
    v = _judge(json.dumps({**GOOD, "correct": "no", "confidence": 30}), [])("q", "Osaka", "Tokyo")
    assert (v.correct, v.rule, v.confidence) == (False, "llm", 30)


def test_rule_stand_in_fills_the_same_object_without_a_model():
    def call(*a, **k):
        raise AssertionError("a rule judge must not call a model")

    response = "Explanation: it is the seat of government.\nAnswer: Tokyo\nConfidence: 72%"
    v = Judge("exact", call=call, style="hle")("q", "Tokyo", "tokyo", response=response)
    assert (v.correct, v.rule, v.confidence) == (True, "exact", 72)
    assert v.structured["extracted_final_answer"] == "Tokyo" and v.structured["strict"] is True
    assert parse_hle_reply(v.raw) == v.structured
    v = Judge("contains", call=call, style="hle")("q", "x", "1835", response="Answer: born in 1835\n")
    assert (v.correct, v.confidence) == (True, 100)                 # no stated confidence: 100 (HLE's prompt)
    v = Judge("exact", call=call, style="hle")("q", "It is Tokyo", "Tokyo")   # no Answer: line: the whole text
    assert (v.correct, v.structured["extracted_final_answer"]) == (False, "It is Tokyo")
    assert json.loads(hle_rule_reply("Answer: A\nConfidence: 250%", "A", "exact"))["confidence"] == 100


def test_through_llm_call_to_an_openai_emulator_with_o3_minis_rules(tmp_path, monkeypatch):
    """Judge -> LLM_CALL -> the shipped o3-mini registry entry (rules) -> HTTP: what OpenAI accepts."""
    from provider_emulator import ProviderEmulator, emulator_registry

    from LLM_CALL import ProviderRejected, get_llm_response

    with ProviderEmulator({}) as emu:
        models = tmp_path / "models.yaml"
        models.write_text(yaml.safe_dump(emulator_registry(emu.root)))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        monkeypatch.setenv("EMULATOR_KEY", "k")
        judge = Judge("o3-mini", style="hle", max_tokens=4096)
        right = judge("Capital of Japan?", "Tokyo", "Tokyo", response="Answer: Tokyo\nConfidence: 90%")
        wrong = judge("Capital of Japan?", "Osaka", "Tokyo", response="Answer: Osaka")
        # the emulator refuses a strict schema OpenAI would refuse (its check is live)
        loose = {"type": "json_schema", "json_schema": {**HLE_RESPONSE_FORMAT["json_schema"],
                 "schema": {k: v for k, v in HLE_RESPONSE_FORMAT["json_schema"]["schema"].items()
                            if k != "additionalProperties"}}}
        with pytest.raises(ProviderRejected, match="additionalProperties"):
            get_llm_response("o3-mini", [{"role": "user", "content": "x"}], temperature=None, response_format=loose)
        bodies = [b for b in emu.seen if b["model"] == "o3-mini"]
    assert len(emu.rejected) == 1 and len(bodies) == 3
    for body in bodies[:2]:
        assert "temperature" not in body and "top_p" not in body and "max_tokens" not in body
        assert body["max_completion_tokens"] == 4096
        assert body["response_format"] == FIXTURE["response_format"]
        assert [m["role"] for m in body["messages"]] == ["user"]
    assert (right.correct, right.confidence, right.rule) == (True, 90, "llm")
    assert (wrong.correct, wrong.confidence) == (False, 100)
    assert right.cost > 0 and right.usage.prompt_tokens > 100    # priced as o3-mini by tools.json
