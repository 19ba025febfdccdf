"""The judge's rules (empty, > 500 words, exact match) and its LLM path."""
import pytest

from evaluation.scoring.judge import Judge, JudgeError, load_judge_prompt, parse_judge_reply, rule_verdict
from orchestrator.records import LLMResponse, Usage


def test_empty_and_whitespace_predictions_are_wrong():
    for pred in (None, "", "   \n"):
        v = rule_verdict(pred, "Paris")
        assert (v.correct, v.rule) == (False, "empty")


def test_500_words_is_allowed_501_is_wrong():
    assert rule_verdict(" ".join(["word"] * 500), "Paris") is None       # goes to the LLM judge
    v = rule_verdict(" ".join(["Paris"] * 501), "Paris")
    assert (v.correct, v.rule) == (False, "too_long")


def test_case_insensitive_exact_match_after_strip_is_right():
    v = rule_verdict("  jane BALLOU \n", "Jane Ballou")
    assert (v.correct, v.rule) == (True, "exact")
    assert rule_verdict("Jane Ballou.", "Jane Ballou") is None             # not exact: the LLM decides


@pytest.mark.parametrize("reply,expected", [
    ("True", True), ("false", False), ("The answer matches. True", True),
    ("It first looks true but the year differs, so: False", False), ("<correct>True</correct>", True),
    ("Untrue statements aside, I cannot tell", None), ("", None)])
def test_parse_judge_reply_takes_the_last_true_false_word(reply, expected):
    assert parse_judge_reply(reply) is expected


def test_llm_path_stores_verdict_raw_reply_and_cost():
    seen = []

    def call(model, messages, **kw):
        seen.append((model, messages, kw))
        return LLMResponse(model=model, text="Both name the same person. True", usage=Usage(120, 8),
                           cost=0.00042, latency=0.5)

    judge = Judge("judge-model", call=call)
    v = judge("Who?", "Charlotte Brontë", "Charlotte Bronte")
    assert (v.correct, v.rule, v.raw, v.judge_model) == (True, "llm", "Both name the same person. True", "judge-model")
    assert v.cost == 0.00042 and v.usage == Usage(120, 8)
    prompt = seen[0][1][0]["content"]
    assert "Who?" in prompt and "Charlotte Brontë" in prompt and "Charlotte Bronte" in prompt
    assert seen[0][2]["temperature"] == 0.0
    # the rules never reach the model
    judge("Who?", "charlotte bronte", "Charlotte Bronte")
    assert len(seen) == 1


def test_unparseable_reply_is_a_judge_error_not_a_wrong_answer():
    judge = Judge("m", call=lambda *a, **k: LLMResponse(model="m", text="I am not sure."))
    v = judge("q", "a", "b")
    assert (v.correct, v.rule, v.raw) == (None, "llm_unparsed", "I am not sure.")


def _upstream_judge(reply: str, seen: list):
    def call(model, messages, **kw):
        seen.append((messages[0]["content"], kw))
        return LLMResponse(model=model, text=reply)
    return Judge("gpt-5", call=call, style="upstream", max_tokens=40000)


def test_upstream_judge_prompt_is_upstreams_construction():
    seen = []
    _upstream_judge("<correct>True</correct>", seen)("What is 2+2?", " four ", "4")
    # eval_hle.py 276-279: question, student answer (the stripped prediction), reference, instruction
    assert seen[0][0] == ("Question: What is 2+2?\n\nStudent answer: four\n\nReference answer: 4\n\n"
                          "Assume that the reference answer is correct. Output <correct>True</correct> if the "
                          "student answer matches the reference answer. Output <correct>False</correct> if the "
                          "student answer does not match the reference answer.")
    assert seen[0][1]["temperature"] == 1.0 and seen[0][1]["max_tokens"] == 40000


@pytest.mark.parametrize("reply, expected", [
    ("<correct>True</correct>", True),
    ("The student says four, which is 4.\n<correct>true</correct>", True),
    ("<correct> False </correct>", False),
    ("Reasoning... <correct>True</correct> wait, no: <correct>False</correct>", False),   # the last tag decides
    ("True", True),            # no tag: upstream compared the whole reply with 'true'
    ("It is True", None),      # ... anything else is unreadable (upstream: False)
    ("The answer is correct.\nTrue", None),   # no last-line fallback
    ("", None),
])
def test_upstream_judge_extraction(reply, expected):
    v = _upstream_judge(reply, [])("q", "a", "b")
    assert v.correct is expected and v.rule == ("llm" if expected is not None else "llm_unparsed")


def test_judge_failure_raises_judge_error():
    def call(*a, **k):
        raise TimeoutError("read timed out")

    with pytest.raises(JudgeError, match="judge 'm' failed: TimeoutError: read timed out"):
        Judge("m", call=call)("q", "a", "b")


def test_prompt_file_must_use_exactly_the_three_placeholders(tmp_path):
    assert "{prediction}" in load_judge_prompt()
    bad = tmp_path / "judge.txt"
    bad.write_text("Q: {question} A: {answer}")
    with pytest.raises(JudgeError, match="must use exactly"):
        load_judge_prompt(bad)
    with pytest.raises(JudgeError, match="cannot read"):
        load_judge_prompt(tmp_path / "missing.txt")


def test_llm_judge_through_llm_call_and_a_local_openai_server(tmp_path, monkeypatch):
    """The default path: Judge -> LLM_CALL -> registry -> HTTP -> an OpenAI-compatible server."""
    from evaluation.mock_backend import MockBackend, registry_yaml

    with MockBackend() as server:
        models = tmp_path / "models.yaml"
        models.write_text(registry_yaml(server.base_url, ["local-judge"]))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        judge = Judge("local-judge")
        right = judge("Who wrote Jane Eyre?", "It was Charlotte Bronte.", "Charlotte Bronte")
        wrong = judge("Who wrote Jane Eyre?", "Emily Bronte", "Charlotte Bronte")
        assert server.requests == 2
    assert (right.correct, right.rule, right.raw) == (True, "llm", "True")
    assert (wrong.correct, wrong.rule, wrong.raw) == (False, "llm", "False")
    # priced by tools.json: the registry entry charges the Qwen3-8B rate (0.2 $/1M in and out)
    assert right.cost == pytest.approx((right.usage.prompt_tokens + right.usage.completion_tokens) * 0.2e-6)
    assert right.usage.prompt_tokens > 50 and right.latency > 0


def test_rule_judges_call_no_model():
    def call(*a, **k):
        raise AssertionError("a rule judge must not call a model")

    exact, contains = Judge("exact", call=call), Judge("contains", call=call)
    assert (exact("q", "Paris", "paris").rule, exact("q", "It is Paris", "Paris").correct) == ("exact", False)
    v = contains("q", "He was born in 1835, in Ohio.", "1835")
    assert (v.correct, v.rule, v.judge_model) == (True, "contains", "contains")
    v = contains("q", "Born in 18350.", "1835")         # whole words only
    assert (v.correct, v.rule) == (False, "not_contained")
