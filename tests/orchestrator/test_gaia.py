"""GAIA: the loader on a GAIA-format folder with attached files, the attachment inside the
sandboxed code tool, and web search through Tavily's API (tests/tavily_emulator.py stands in for
it).  The scorer and the `gaia` judge: tests/evaluation/scoring/test_gaia_scorer.py."""
import json
from pathlib import Path

import pytest

from _gaia_sample import ATTACHMENTS, TEST, VALIDATION, write_gaia
from orchestrator.catalog import load_catalog
from orchestrator.benchmarks import LoaderError, load_benchmark
from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import format_tool_call


# ---- the loader: GAIA's folder layout ----------------------------------------------------------
def test_loader_reads_a_gaia_split_folder_with_attachments(tmp_path):
    root = write_gaia(tmp_path / "GAIA")
    result = load_benchmark("gaia", root)            # the dataset root: 2023/validation by default
    assert [t.id for t in result.tasks] == [r["task_id"] for r in VALIDATION] and not result.malformed
    csv_task, text_task = result.tasks[0], result.tasks[1]
    folder = root / "2023" / "validation"
    assert csv_task.files == {VALIDATION[0]["file_name"]: str(folder / VALIDATION[0]["file_name"])}
    assert csv_task.answer == "42" and csv_task.meta == {"level": 2, "file_name": VALIDATION[0]["file_name"]}
    # the orchestrator is told the file's name; the question comes first, then the answer rules
    assert csv_task.question.startswith(VALIDATION[0]["Question"] + "\n\nAttached file: " + VALIDATION[0]["file_name"])
    assert "comma-separated list" in csv_task.question
    assert text_task.files == {} and "Attached file" not in text_task.question
    # the split folder itself and its metadata file name the same tasks
    for data in (folder, folder / "metadata.jsonl"):
        assert [t.id for t in load_benchmark("gaia", data).tasks] == [t.id for t in result.tasks]


def test_test_split_answers_are_unknown(tmp_path):
    result = load_benchmark("gaia", write_gaia(tmp_path), split="test")
    assert [t.id for t in result.tasks] == [r["task_id"] for r in TEST]
    assert [t.answer for t in result.tasks] == [None, None]          # "?" is no reference


def test_level_and_text_only_select_and_count(tmp_path):
    root = write_gaia(tmp_path)
    level1 = load_benchmark("gaia", root, level=1)
    assert [t.meta["level"] for t in level1.tasks] == [1, 1] and level1.skipped == {"other level": 2}
    text = load_benchmark("gaia", root, text_only=True)
    # the text-only subset: the tasks whose file_name is empty (no attached file)
    assert [t.id for t in text.tasks] == [VALIDATION[1]["task_id"], VALIDATION[2]["task_id"]]
    assert text.skipped == {"attached file": 2} and "2 tasks, 2 skipped (attached file)" == text.summary()
    with pytest.raises(LoaderError, match="--level 4: GAIA's levels are 1, 2 and 3"):
        load_benchmark("gaia", root, level=4)


def test_missing_attachment_is_one_clear_error(tmp_path):
    root = write_gaia(tmp_path)
    missing = root / "2023" / "validation" / VALIDATION[3]["file_name"]
    missing.unlink()
    with pytest.raises(LoaderError) as err:
        load_benchmark("gaia", root)
    assert f"1 attached file(s) named in 'file_name' are missing (first: task {VALIDATION[3]['task_id']}: {missing})" \
        in str(err.value) and "--text-only" in str(err.value)
    assert len(load_benchmark("gaia", root, text_only=True).tasks) == 2      # the way round it
    assert len(load_benchmark("gaia", root, limit=2).tasks) == 2             # only loaded tasks are checked


def test_malformed_records_and_bad_folders_are_named(tmp_path):
    folder = tmp_path / "2023" / "validation"
    folder.mkdir(parents=True)
    rows = [dict(VALIDATION[1], Level="high"), dict(VALIDATION[2], task_id="x", **{"Final answer": ""}),
            dict(VALIDATION[1], task_id="ok")]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = load_benchmark("gaia", tmp_path)
    assert [t.id for t in result.tasks] == ["ok"]
    assert [(m.source, m.line, m.reason) for m in result.malformed] == [
        (str(folder / "metadata.jsonl"), 1, "field 'Level' is 'high', expected 1, 2 or 3"),
        (str(folder / "metadata.jsonl"), 2, "field 'Final answer' is empty")]
    with pytest.raises(LoaderError, match="no GAIA metadata.jsonl or metadata.parquet in"):
        load_benchmark("gaia", tmp_path, split="test")
    with pytest.raises(LoaderError, match="no such folder"):
        load_benchmark("gaia", tmp_path / "nowhere")


def test_parquet_layout_of_october_2025(tmp_path):
    """The dataset now also ships metadata.parquet (same columns, plus file_path)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = write_gaia(tmp_path) / "2023" / "validation"
    rows = [dict(r, file_path=f"2023/validation/{r['file_name']}" if r["file_name"] else "") for r in VALIDATION]
    (folder / "metadata.jsonl").unlink()
    pq.write_table(pa.Table.from_pylist(rows), folder / "metadata.parquet")
    result = load_benchmark("gaia", tmp_path)
    assert [t.id for t in result.tasks] == [r["task_id"] for r in VALIDATION]
    assert result.tasks[0].files == {VALIDATION[0]["file_name"]: str(folder / VALIDATION[0]["file_name"])}


# ---- the attachment inside the sandbox ---------------------------------------------------------
class ScriptedPolicy:
    price_model = "Qwen3-8B"

    def __init__(self, replies):
        self.replies = list(replies)

    def act(self, messages, tools, **kw):
        from orchestrator.policy import PolicyOutput
        return PolicyOutput(text=self.replies.pop(0), usage=Usage(10, 5), latency=0.0)


def test_the_code_tool_reads_the_attachment_in_the_sandbox(tmp_path):
    """A GAIA task's attached file is copied into the sandbox's working folder of every code run
    (the real sandbox: bubblewrap or the strongest level here); the host copy stays untouched."""
    task = load_benchmark("gaia", write_gaia(tmp_path)).tasks[0]
    name = VALIDATION[0]["file_name"]
    code = (f"import csv\nrows = list(csv.DictReader(open({name!r})))\nprint(sum(int(r['n']) for r in rows))\n"
            f"open({name!r}, 'a').write('99\\n')\n")
    seen = []

    def llm(model, messages, **kw):
        seen.append(messages[-1]["content"])
        return LLMResponse(model=model, text=f"```python\n{code}```" if len(seen) == 1 else "<answer>42</answer>",
                           usage=Usage(10, 5))

    runtime = ToolRuntime(catalog=load_catalog(), serve="local", llm=llm)
    policy = ScriptedPolicy([format_tool_call("enhance_reasoning", {"model": "reasoner-2"}),
                             format_tool_call("answer", {"model": "answer-1"})])
    rollout = run_episode(Task(task.id, task.question, task.answer, metadata={**task.meta, "files": task.files}),
                          policy, runtime, LoopConfig(max_turns=4))
    code_turn = rollout.turns[0].expert
    assert code_turn.error is None and code_turn.output == "42", code_turn.output
    assert f"Attached file: {name}" in seen[0]                 # the expert read the file's name
    assert rollout.final_answer == "42"
    assert Path(task.files[name]).read_text() == ATTACHMENTS[name]   # the code changed only its copy


def test_without_attachments_the_code_tool_is_called_as_before():
    calls = []

    def run_code(code, timeout):          # a two-argument sandbox (tests, custom runners) still works
        calls.append(code)
        from types import SimpleNamespace
        return SimpleNamespace(stdout="1\n", stderr="", exit_code=0, timed_out=False, duration_s=0.1)

    from orchestrator.context import EpisodeState
    llm = lambda model, messages, **kw: LLMResponse(model=model, text="```python\nprint(1)\n```", usage=Usage(1, 1))
    call, _ = ToolRuntime(catalog=load_catalog(), llm=llm, run_code=run_code).call(
        "enhance_reasoning", "reasoner-2", EpisodeState("q"))
    assert call.error is None and calls == ["print(1)"]


# ---- web search through Tavily's API -----------------------------------------------------------
PAGES = {"https://example.org/louvre": "The Louvre is an art museum in Paris, France.",
         "https://example.org/danube": "The Danube flows through Vienna.",
         "https://example.org/cats": "Cats sleep a lot."}


def test_web_retriever_searches_extracts_and_reports_fees():
    pytest.importorskip("tavily", reason="the web search needs tavily-python")
    from tavily_emulator import TavilyEmulator
    from retrieval.client import WebRetriever
    from retrieval.web import WebSearch

    with TavilyEmulator(PAGES) as api:
        web = WebRetriever(WebSearch("tvly-test", base_url=api.base_url))
        hits = web.retrieve(["Louvre museum city"], topk=2, eid="ignored", min_score=0.5)
    assert [h["document"]["id"] for h in hits[0]] == ["web:https://example.org/louvre"]
    assert hits[0][0]["document"] == {"id": "web:https://example.org/louvre", "url": "https://example.org/louvre",
                                      "contents": PAGES["https://example.org/louvre"], "source": "web"}
    assert (hits.web_searches, hits.pages) == (1, 1)
    (path, headers, body), (path2, _, body2) = api.calls
    assert (path, path2) == ("/search", "/extract") and headers["Authorization"] == "Bearer tvly-test"
    assert body["query"] == "Louvre museum city" and body["max_results"] == 2
    assert body2["urls"] == ["https://example.org/louvre"]
    # fees from tools.json: one search + one extracted page
    catalog = load_catalog()
    assert catalog.search_cost(web_searches=1, pages=1) == pytest.approx(catalog.fees.web_search + catalog.fees.web_extract_page)


def test_web_retriever_refusals_end_the_task_and_failures_are_tool_errors():
    pytest.importorskip("tavily", reason="the web search needs tavily-python")
    from tavily_emulator import TavilyEmulator
    from retrieval.client import RetrievalError, RetrievalRejected
    from retrieval.client import WebRetriever
    from retrieval.web import WebSearch

    with TavilyEmulator(PAGES) as api:
        wrong_key = WebRetriever(WebSearch("tvly-wrong", base_url=api.base_url))
        with pytest.raises(RetrievalRejected, match="InvalidAPIKeyError.*missing or invalid API key"):
            wrong_key.retrieve(["louvre"])
        web = WebRetriever(WebSearch("tvly-test", base_url=api.base_url))
        api.fail_next = [432]
        with pytest.raises(RetrievalRejected, match="ForbiddenError.*usage limit"):
            web.retrieve(["louvre"])
        api.fail_next = [429]
        with pytest.raises(RetrievalError, match="UsageLimitExceededError") as err:
            web.retrieve(["louvre"])
        assert not isinstance(err.value, RetrievalRejected)     # a rate limit: the orchestrator may try again
