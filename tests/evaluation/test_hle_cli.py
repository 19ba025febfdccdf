"""run_hle.py --judge hle and --text-only end to end against the provider emulator (real HTTP).

The paper profile's models all answer from tests/provider_emulator.py, which enforces OpenAI's
rules for o3-mini (no temperature, max_completion_tokens, a strict structured-output schema)
and answers HLE's judge prompt with HLE's ExtractedAnswer object.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from provider_emulator import ProviderEmulator, emulator_registry

ROWS = [{"id": "q1", "question": "What is the capital of Japan?", "answer": "Tokyo", "image": ""},
        {"id": "q2", "question": "Which city hosts the Louvre?", "answer": "Paris", "image": ""},
        {"id": "q3", "question": "What is shown in the figure?", "answer": "a cat", "image": "data:image/png;base64,iVBO"},
        {"id": "q4", "question": "Who wrote Hamlet?", "answer": "William Shakespeare", "image": ""}]


@pytest.fixture()
def hle(tmp_path, monkeypatch, capsys):
    answers = {r["question"]: r["answer"] for r in ROWS}
    with ProviderEmulator(answers, plan=[("answer", "answer-1")], answer_prefix="Confidence: 80%\n") as emu:
        models = tmp_path / "models.yaml"
        models.write_text(yaml.safe_dump(emulator_registry(emu.root)))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        monkeypatch.setenv("EMULATOR_KEY", "emulator-key")
        monkeypatch.setenv("COLUMNS", "250")
        monkeypatch.chdir(tmp_path)
        data = tmp_path / "hle.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))

        def run(out, *args):
            from evaluation.qa_cli import main

            capsys.readouterr()
            code = main("hle", ["--profile", "paper", "--model", "Qwen3-8B", "--data", str(data), "--retriever",
                                emu.root, "--output", str(tmp_path / out), "--no-progress", *map(str, args)])
            stdout, stderr = capsys.readouterr()
            return SimpleNamespace(code=code, stdout=stdout, stderr=stderr, out=tmp_path / out)
        yield run, emu


def _records(out):
    return {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_judge_hle_on_the_paper_profile_sends_what_openai_accepts_and_reports_calibration(hle):
    run, emu = hle
    r = run("judged", "--judge", "hle")
    assert r.code == 0, r.stderr
    assert "judge o3-mini (hle)" in r.stdout and "text-only: 1 image questions skipped" in r.stdout
    assert emu.rejected == []
    config = json.loads((r.out / "run_config.json").read_text())
    assert (config["judge"], config["judge_model"], config["judge_style"], config["text_only"]) == \
        ("hle", "o3-mini", "hle", True)
    assert config["settings"]["judge"] == {"model": "o3-mini", "prompt": "hle", "max_tokens": 4096}
    judge_bodies = [b for b in emu.seen if b.get("model") == "o3-mini"]
    assert len(judge_bodies) == 3
    for body in judge_bodies:
        assert "temperature" not in body and "max_tokens" not in body and body["max_completion_tokens"] == 4096
        assert body["response_format"]["json_schema"]["name"] == "ExtractedAnswer"
        assert body["messages"][0]["content"].startswith("Judge whether the following [response] to [question]")
    recs = _records(r.out)
    assert set(recs) == {"q1", "q2", "q4"}
    for rec in recs.values():
        assert rec["status"] == "ok" and rec["correct"] is True
        assert "Confidence: 80%" in rec["response"]               # the whole answer text reached the judge
        assert rec["verdict"]["confidence"] == 80 and rec["verdict"]["structured"]["correct"] == "yes"
    summary = json.loads((r.out / "summary.json").read_text())
    assert summary["judge"] == "o3-mini (hle)"
    assert summary["hle"]["accuracy_pct"] == 100.0 and summary["hle"]["ci95_halfwidth_pct"] == 0.0
    assert summary["hle"]["stated_confidence"] == 3 and summary["hle"]["calibration_error_pct"] is None
    assert "HLE metrics" in r.stdout and "o3-mini (hle)" in r.stdout

    # the judge is part of what a resume must keep
    r = run("judged", "--resume", "--no-report")
    assert r.code == 2 and "judge: 'hle' -> None" in r.stderr


def test_no_text_only_keeps_image_questions_and_records_it(hle):
    run, _ = hle
    r = run("all", "--no-text-only", "--no-report")
    assert r.code == 0, r.stderr
    assert "--no-text-only: 1 image questions run with their text alone" in r.stdout
    recs = _records(r.out)
    assert set(recs) == {"q1", "q2", "q3", "q4"} and recs["q3"]["meta"]["image"] is True
    config = json.loads((r.out / "run_config.json").read_text())
    assert config["text_only"] is False and config["judge"] is None and config["judge_model"] == "gpt-5"


def test_unknown_named_judge_is_a_one_line_error(hle):
    run, _ = hle
    r = run("bad", "--judge", "o3")
    assert r.code == 2 and "--judge o3: not a named judge of profile 'paper'" in r.stderr and "['hle']" in r.stderr
