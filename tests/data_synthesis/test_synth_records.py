"""Training records: randomised tools/aliases/prices/preferences, stated in words; files round-trip."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from data_synthesis.dataset import write_dataset
from data_synthesis.examples import Randomization, load_qa, qa_examples, tau2_examples
from data_synthesis.records import TrainingExample, load_examples
from data_synthesis.tasks import to_tau2_task
from data_synthesis.templates import Draft
from orchestrator.catalog import load_catalog

CATALOG = load_catalog()
QA = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(200)]


def _tau2_tasks(levels):
    tasks = []
    for i, n_actions in enumerate(levels):
        acts = [{"name": "get_x", "arguments": {"id": str(j)}} for j in range(n_actions)]
        tasks.append(to_tau2_task(Draft("t", "read", acts, "xs 1", "", "", "", [f"Question {i}"], ["v"]), "toy", f"t{i}"))
    return tasks


@pytest.fixture(scope="module")
def qa():
    return qa_examples(QA, "toyqa", CATALOG, seed=7, cfg=Randomization())


def test_every_example_states_its_tools_prices_and_preference_in_words(qa):
    for ex in qa[:50]:
        assert ex.instruction.startswith(ex.question)
        for tool, per in ex.tools.items():
            assert f"- {tool}: " in ex.instruction
            for alias, model in per.items():
                p = ex.prices[model]
                assert f"{alias} = {model} (${p.input:g} / ${p.output:g}, {ex.latency_s[alias]:g} s)" in ex.instruction
        assert ex.instruction.endswith("Preference: " + ex.preference_text)
        assert set(ex.preference) <= set(ex.aliases) | {"outcome", "cost", "latency"}
        assert ex.preference["outcome"] == 1.0


def test_randomisation_varies_across_examples(qa):
    names = Counter(e.preference_name.split(":")[0] for e in qa)
    assert len(names) >= 7, names
    assert len({json.dumps(e.preference, sort_keys=True) for e in qa}) >= 30
    assert len({e.prices["gpt-5"].input for e in qa if "gpt-5" in e.prices}) >= 50
    assert {m for e in qa for a, m in e.aliases.items() if a == "search-1"} >= {"gpt-5", "gpt-5-mini", "Qwen3-32B"}
    assert any("search" not in e.tools for e in qa) and any("search" in e.tools for e in qa)
    assert all("answer" in e.tools and e.tools["answer"] for e in qa)
    # "cheapest" and "avoid tool X" say so in words, and the vector says the same
    cheap = next(e for e in qa if e.preference_name == "cheapest")
    assert cheap.preference == {"outcome": 1.0, "cost": 1.0} and "cheapest" in cheap.instruction
    avoid = next(e for e in qa if e.preference_name.startswith("avoid_tool:"))
    tool = avoid.preference_name.split(":")[1]
    assert {a for a, w in avoid.preference.items() if w == -1.0} == set(avoid.tools[tool])
    assert f"Avoid the {tool} tool" in avoid.instruction


def test_prices_are_catalog_prices_times_a_bounded_factor(qa):
    for ex in qa:
        for model, p in ex.prices.items():
            base = CATALOG.price(model)
            for got, ref in ((p.input, base.input), (p.output, base.output)):
                assert 1 / 2 * 0.995 <= got / ref <= 2 * 1.005
    flat = qa_examples(QA[:5], "toyqa", CATALOG, seed=7, cfg=Randomization(price_jitter=1.0))
    assert all(p.input == CATALOG.price(m).input and p.output == CATALOG.price(m).output
               for e in flat for m, p in e.prices.items())


def test_same_seed_same_examples_other_seed_differs(qa):
    again = qa_examples(QA, "toyqa", CATALOG, seed=7, cfg=Randomization())
    other = qa_examples(QA, "toyqa", CATALOG, seed=8, cfg=Randomization())
    assert [e.model_dump() for e in again] == [e.model_dump() for e in qa]
    assert [e.preference for e in other] != [e.preference for e in qa]


def test_tau2_examples_offer_call_expert_and_keep_the_task():
    tasks = _tau2_tasks([1, 3, 5])
    exs = tau2_examples(tasks, "toy", CATALOG, seed=1, cfg=Randomization(), domain_dir="out/toy")
    assert [e.difficulty for e in exs] == ["easy", "medium", "hard"]
    for ex, task in zip(exs, tasks):
        assert set(ex.tools) == {"call_expert"} and ex.tau2_task == task and ex.answer is None
        assert ex.instruction.startswith("Models you can call")


def test_files_round_trip_and_card_counts(tmp_path, qa):
    exs = qa[:4] + tau2_examples(_tau2_tasks([1, 2, 3, 5, 6]), "toy", CATALOG, seed=1, cfg=Randomization())
    counts = write_dataset(exs, tmp_path / "a", "Test set")
    write_dataset(exs, tmp_path / "b", "Test set")
    for name in ("train.parquet", "train.jsonl", "README.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert load_examples(str(tmp_path / "a" / "train.parquet")) == exs
    assert load_examples(str(tmp_path / "a" / "train.jsonl")) == exs
    assert counts["by_kind"] == {"qa": 4, "tau2": 5}
    card = (tmp_path / "a" / "README.md").read_text()
    assert "| qa | toyqa | 0 | 0 | 0 | 4 | 4 |" in card
    assert "| tau2 | toy | 2 | 1 | 2 | 0 | 5 |" in card   # 1,2 actions easy; 3 medium; 5,6 hard


def test_record_validation_errors():
    ex = qa_examples(QA[:1], "toyqa", CATALOG, seed=0, cfg=Randomization())[0]
    row = ex.model_dump()
    with pytest.raises(ValueError, match="preference keys must be aliases"):
        TrainingExample.model_validate({**row, "preference": {"outcome": 1.0, "search-9": 1.0}})
    with pytest.raises(ValueError, match="prices lack models"):
        TrainingExample.model_validate({**row, "prices": {}})
    with pytest.raises(ValueError, match="a qa example needs an answer"):
        TrainingExample.model_validate({**row, "answer": None})


def test_load_qa_names_the_bad_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"id": "a", "question": "q?", "answer": "x"}\n{"id": "b", "question": "q?"}\n')
    with pytest.raises(ValueError, match=r"qa.jsonl: line 2: needs non-empty \['answer'\]"):
        load_qa(path)
    path.write_text('{"id": "a"\n')
    with pytest.raises(ValueError, match="qa.jsonl: line 1: invalid JSON"):
        load_qa(path)


def test_examples_feed_the_loops_task_catalog(qa):
    loop = pytest.importorskip("orchestrator.loop")
    ex = qa[0]
    cat = loop.task_catalog(CATALOG, loop.Task(**ex.loop_task_kwargs()))
    assert {t.name: {a: s.model for a, s in t.aliases.items()} for t in cat.tools} == ex.tools
    for model, p in ex.prices.items():
        assert (cat.price(model).input, cat.price(model).output) == (p.input, p.output)
