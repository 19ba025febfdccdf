"""The static trajectory viewer, opened in headless Chromium (Debian's `chromium`)."""
import shutil
import subprocess

import pytest

from evaluation.viewer import write_viewer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

RECORDS = [
    {"id": "q1", "status": "ok", "correct": True, "question": "Capital of France?", "reference": "Paris",
     "prediction": "Paris", "verdict": {"rule": "exact"}, "cost": 0.001, "latency": 2.0, "turns": []},
    {"id": "q2", "status": "ok", "correct": False, "question": "Who wrote Hamlet?", "reference": "Shakespeare",
     "prediction": "</script><script>document.title='pwned'</script>", "verdict": {"rule": "llm", "raw": "False"},
     "cost": 0.0123, "latency": 31.5, "stop_reason": "answer",
     "turns": [{"index": 0, "reasoning": "I should search first.", "tool": "search", "alias": "search-2",
                "model": "gpt-5-mini", "output": "query: 'Hamlet author'; 3 documents (3 new)", "cost": 0.002,
                "latency": 16.0},
               {"index": 1, "reasoning": "<b>not bold</b>", "tool": "enhance_reasoning", "alias": "reasoner-3",
                "model": "Qwen2.5-Coder-32B-Instruct", "output": "print(6 * 7)\n42", "cost": 0.0003, "latency": 9.0},
               {"index": 2, "reasoning": "oops", "tool": None, "invalid_reason": "unknown tool 'browse'", "cost": 0.0}]},
    {"id": "q3", "status": "error", "error": "LLMCallError: timed out", "correct": None},
]


def dom(path, fragment=""):
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--virtual-time-budget=3000", "--dump-dom", f"file://{path}{fragment}"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_viewer_lists_filters_and_shows_a_trajectory(tmp_path):
    path = write_viewer(tmp_path / "viewer.html", "frames my-orch all", RECORDS)
    everything = dom(path)
    assert "3 of 3 tasks" in everything
    assert 'class="task correct" data-id="q1"' in everything and 'class="task error" data-id="q3"' in everything
    view = dom(path, "#filter=incorrect&task=q2")
    assert "1 of 3 tasks" in view and 'data-id="q1"' not in view and 'data-id="q2"' in view
    # the trajectory: each turn's reasoning, tool, alias, expert model, output and cost
    for text in ("Turn 0: search → search-2 (gpt-5-mini)", "I should search first.",
                 "query: 'Hamlet author'; 3 documents (3 new)", "Turn 1: enhance_reasoning → reasoner-3",
                 "print(6 * 7)\n42", "invalid: unknown tool 'browse'", "cost $0.012300", "verdict: llm — judge said: False"):
        assert text in view, text
    # model text is shown as text, never run or rendered as HTML
    assert "<title>frames my-orch all</title>" in view and "pwned</title>" not in view
    assert "&lt;b&gt;not bold&lt;/b&gt;" in view
