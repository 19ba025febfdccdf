"""data_synthesis/contamination.py + data_synthesis.dataset: no evaluation benchmark in training data."""
import json
from pathlib import Path

import pytest

from data_synthesis.contamination import (
    check_not_eval,
    normalise,
    overlaps,
    question_hash,
    shipped_sets,
)
from data_synthesis.dataset import main

FRAMES = Path(__file__).resolve().parents[2] / ".." / "shared" / "benchmarks" / "frames" / "frames.jsonl"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_normalisation_ignores_case_punctuation_and_spacing():
    assert normalise("  What's the  CAPITAL of France?? ") == "what s the capital of france"
    assert question_hash("What is 2+2?") == question_hash("what is 2 + 2")
    assert question_hash("What is 2+2?") != question_hash("What is 2+3?")


def test_overlap_names_the_set_and_the_ids():
    sets = {"bench": {question_hash("Who wrote Hamlet?")}}
    rows = [{"id": "a", "question": "who wrote hamlet"}, {"id": "b", "question": "Who wrote Faust?"}]
    assert overlaps(rows, sets) == {"bench": ["a"]}
    with pytest.raises(ValueError, match=r"--qa x.jsonl: 1 of its 2 questions are in the evaluation set 'bench'.*'a'"):
        check_not_eval(rows, "--qa x.jsonl", sets)
    check_not_eval(rows[1:], "--qa x.jsonl", sets)      # no overlap: no error


def test_frames_hashes_are_shipped():
    assert len(shipped_sets()["frames"]) == 824


@pytest.mark.skipif(not FRAMES.exists(), reason="../shared/benchmarks/frames/frames.jsonl is absent")
def test_shipped_frames_hashes_match_the_frames_file():
    rows = [json.loads(line) for line in FRAMES.read_text().splitlines() if line.strip()]
    assert {question_hash(r["question"]) for r in rows} == shipped_sets()["frames"]


def test_dataset_refuses_a_qa_file_with_a_frames_question_and_says_which(tmp_path, capsys):
    frames_q = "If my future wife has the same first name as the 15th first lady of the United States' mother and " \
               "her surname is the same as the second assassinated president's mother's maiden name, what is my " \
               "future wife's name? "
    assert question_hash(frames_q) in shipped_sets()["frames"]
    qa = _write(tmp_path / "qa.jsonl", [{"id": "mine-1", "question": "What is 17 * 3?", "answer": "51"},
                                        {"id": "copied", "question": frames_q.upper(), "answer": "Jane Ballou"}])
    assert main(["--qa", str(qa), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "evaluation set 'frames'" in err and "copied" in err and "--allow-eval-overlap" in err
    assert not (tmp_path / "out").exists()
    # the override lets it through, and a clean file passes by default
    assert main(["--qa", str(qa), "--out", str(tmp_path / "forced"), "--allow-eval-overlap"]) == 0
    clean = _write(tmp_path / "clean.jsonl", [{"id": "mine-1", "question": "What is 17 * 3?", "answer": "51"}])
    assert main(["--qa", str(clean), "--out", str(tmp_path / "ok")]) == 0


def test_eval_set_flag_adds_a_benchmark_for_the_run(tmp_path, capsys):
    bench = _write(tmp_path / "bench.jsonl", [{"id": "b1", "question": "Name the third moon of Zog.", "answer": "x"}])
    qa = _write(tmp_path / "qa.jsonl", [{"id": "q1", "question": "name the third moon of zog", "answer": "x"}])
    assert main(["--qa", str(qa), "--out", str(tmp_path / "o"), "--eval-set", f"mybench={bench}"]) == 1
    assert "evaluation set 'mybench'" in capsys.readouterr().err
    assert main(["--qa", str(qa), "--out", str(tmp_path / "o"), "--eval-set", "nonsense"]) == 1
    assert "expected NAME=FILE" in capsys.readouterr().err
