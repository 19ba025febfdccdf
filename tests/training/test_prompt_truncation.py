"""rollout.prompt_truncation: middle cuts a turn's templated prompt as upstream's trainer does
(verl postprocess_data, truncation='middle': the first max_length // 2 ids and the rest from the end)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.chat_template import cut_middle
from orchestrator.policy import TokenPolicy
from training import rollouts
from training.config import load_config
from training.session import prompt_cap

ROOT = Path(__file__).resolve().parents[2]


def test_cut_middle_keeps_the_first_half_and_the_rest_from_the_end():
    ids = list(range(10))
    assert cut_middle(ids, 4) == [0, 1, 8, 9]          # 4 // 2 = 2 from the head, 2 from the tail
    assert cut_middle(ids, 5) == [0, 1, 7, 8, 9]       # odd: 5 // 2 = 2 from the head, 3 from the tail
    assert cut_middle(ids, 10) == ids and cut_middle(ids, 11) == ids   # short enough: untouched
    with pytest.raises(ValueError, match="limit"):
        cut_middle(ids, 0)


def test_cut_middle_at_upstreams_24000_tokens():
    ids = list(range(30_000))
    cut = cut_middle(ids, 24_000)
    # ids 0..11,999 then 18,000..29,999: the 6,000 ids after the head are gone.
    assert len(cut) == 24_000 and cut[11_999] == 11_999 and cut[12_000] == 18_000 and cut[-1] == 29_999


class CharTokenizer:
    """One id per character; the chat template joins the contents (it names tools, so none are added)."""

    chat_template = "{{ tools }}"

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=False):
        return "".join(m["content"] for m in messages) + ">"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


class RecordingEngine:
    tokenizer = CharTokenizer()

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params, *, seeds=None):
        self.prompts += prompts
        return [SimpleNamespace(text="ok", token_ids=[1], logprobs=[-0.5], policy_version=0)]


@pytest.mark.parametrize("cap, sent", [(None, "abcdefghij>"), (4, "abj>"), (5, "abij>"), (64, "abcdefghij>")])
def test_token_policy_sends_and_records_the_cut_prompt(cap, sent):
    engine = RecordingEngine()
    out = TokenPolicy(engine, "Qwen3-8B", max_prompt_tokens=cap).act(
        [{"role": "system", "content": "abc"}, {"role": "user", "content": "defghij"}], tools=None)
    assert engine.prompts == [[ord(c) for c in sent]]
    assert out.prompt_ids == engine.prompts[0] and out.usage.prompt_tokens == len(sent)   # trained on what was seen


def test_collect_rollouts_hands_the_cap_to_every_policy(monkeypatch):
    seen = []
    monkeypatch.setattr(rollouts, "run_episode", lambda task, policy, runtime, config: seen.append(
        policy.max_prompt_tokens) or task)
    rollouts.collect_rollouts(["t"], RecordingEngine(), SimpleNamespace(), None, rollouts_per_task=2, seed=0,
                              step=0, price_model="Qwen3-8B", concurrency=1, max_prompt_tokens=24_000)
    assert seen == [24_000, 24_000]


def test_the_paper_config_cuts_the_middle_at_24000_and_the_quickstart_does_not():
    assert prompt_cap(load_config(ROOT / "training" / "configs" / "paper.yaml")) == 24_000
    assert prompt_cap(load_config(ROOT / "training" / "configs" / "quickstart.yaml")) is None
    assert prompt_cap(load_config(None)) is None                 # the default: sent whole
