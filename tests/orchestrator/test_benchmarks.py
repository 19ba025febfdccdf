"""Benchmark loaders on real FRAMES records (../shared) and HLE-format records written here."""
import csv
import json
from pathlib import Path

import pytest

from orchestrator.benchmarks import LoaderError, load_benchmark

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
FRAMES_JSONL = SHARED / "benchmarks" / "frames" / "frames.jsonl"


def hle_record(i, **kw):
    rec = {"id": f"hle-{i}", "question": f"What is {i}+{i}?", "image": "", "image_preview": None,
           "answer": str(2 * i), "answer_type": "exactMatch", "author_name": "x", "rationale": "",
           "rationale_image": None, "raw_subject": "Arithmetic", "category": "Math", "canary": "c"}
    rec.update(kw)
    return rec


@pytest.mark.skipif(not FRAMES_JSONL.exists(), reason=f"{FRAMES_JSONL} absent (the ../shared folder is not here)")
def test_frames_jsonl_from_shared_all_824_records():
    result = load_benchmark("frames", FRAMES_JSONL)
    assert len(result.tasks) == 824 and not result.malformed and not result.skipped
    first = result.tasks[0]
    assert first.id == "wiki____0" and first.answer == "Jane Ballou"
    assert first.question.startswith("If my future wife has the same first name as the 15th first lady")
    assert result.tasks[-1].id == "wiki____823"
    assert len(load_benchmark("frames", FRAMES_JSONL, limit=5).tasks) == 5


def test_frames_tsv_hf_columns_give_upstream_ids(tmp_path):
    path = tmp_path / "test.tsv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, delimiter="\t")
        w.writerow(["", "Prompt", "Answer", "wikipedia_link_1", "reasoning_types", "wiki_links"])
        w.writerow([0, "Who wrote\nJane Eyre?", "Charlotte Bronte", "https://en.wikipedia.org/wiki/Jane_Eyre",
                    "Multiple constraints", "['https://en.wikipedia.org/wiki/Jane_Eyre']"])
        w.writerow([1, "How many?", 87, "", "Numerical reasoning", "[]"])
        fh.write("2\tonly two cells\n")              # line 5: too few cells
        w.writerow([3, "", "x", "", "", "[]"])        # line 6: empty prompt
    result = load_benchmark("frames", path)
    assert [t.id for t in result.tasks] == ["wiki____0", "wiki____1"]
    assert result.tasks[0].question == "Who wrote\nJane Eyre?"    # quoted cell over two lines
    assert result.tasks[1].answer == "87"
    assert result.tasks[0].meta["reasoning_types"] == "Multiple constraints"
    assert [(m.line, m.reason) for m in result.malformed] == [
        (5, "2 cells, header has 6"), (6, "field 'Prompt' is empty")]


def test_hle_jsonl_skips_and_counts_image_questions_and_reports_malformed_lines(tmp_path):
    path = tmp_path / "hle.jsonl"
    lines = [json.dumps(hle_record(1)),
             json.dumps(hle_record(2, image="data:image/png;base64,iVBORw0KGgo=")),
             '{"id": "hle-3", "question": "truncated...',                 # line 3: bad JSON
             json.dumps(hle_record(4, answer=None)),                       # line 4: no answer
             "",                                                           # blank lines are not records
             json.dumps([1, 2]),                                           # line 6: not an object
             json.dumps(hle_record(7)),
             json.dumps(hle_record(1))]                                    # line 8: duplicate id
    path.write_text("\n".join(lines) + "\n")
    result = load_benchmark("hle", path)
    assert [t.id for t in result.tasks] == ["hle-1", "hle-7"]
    assert result.tasks[0].meta == {"answer_type": "exactMatch", "category": "Math", "raw_subject": "Arithmetic"}
    assert result.skipped == {"image": 1}
    got = [(m.line, m.reason.split(" (")[0]) for m in result.malformed]
    assert got == [(3, "invalid JSON"), (4, "missing field 'answer'"), (6, "expected a JSON object, got list"),
                   (8, "duplicate id 'hle-1'")]
    assert str(result.malformed[0]).startswith(f"{path}:3: invalid JSON")
    assert result.summary() == "2 tasks, 1 skipped (image), 4 malformed"


def test_hle_parquet_through_datasets(tmp_path):
    import pandas as pd

    path = tmp_path / "hle.parquet"
    pd.DataFrame([hle_record(1), hle_record(2, image="data:image/jpeg;base64,xx"), hle_record(3)]).to_parquet(path)
    result = load_benchmark("hle", path)
    assert [t.id for t in result.tasks] == ["hle-1", "hle-3"] and result.skipped == {"image": 1}


def test_bad_sources_name_the_problem(tmp_path):
    with pytest.raises(LoaderError, match="no such file"):
        load_benchmark("hle", tmp_path / "missing.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(LoaderError, match="unknown file type '.txt'"):
        load_benchmark("hle", tmp_path / "x.txt")
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(LoaderError, match=r"no usable hle records \(1 malformed; first: .*bad.jsonl:1: invalid JSON"):
        load_benchmark("hle", tmp_path / "bad.jsonl")
    with pytest.raises(LoaderError, match="unknown benchmark"):
        load_benchmark("gsm8k", tmp_path / "bad.jsonl")
