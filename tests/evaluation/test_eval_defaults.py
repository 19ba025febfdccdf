"""What run_hle.py / run_frames.py choose when the user gives no profile, budgets or concurrency."""
from evaluation.qa_cli import build_parser, resolve
from orchestrator.catalog import load_catalog

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def resolved(benchmark, *argv):
    args = build_parser(benchmark).parse_args(list(argv))
    _, _, line = resolve(args, benchmark, load_catalog())
    return args, line


def test_hle_data_without_keys_runs_the_embedded_default(monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    args, line = resolved("hle", "--data", "hle.jsonl")
    # today: no profile (experts resolve to gpt-5 with no key), 50 turns x 1,024 free tokens, 16 at once
    assert args.profile == "local" and args.constrained is True
    assert (args.max_turns, args.max_tokens, args.expert_max_tokens) == (4, 64, 64)
    assert args.concurrency == 1 and args.judge_model == "exact"
    assert "profile local" in line and "concurrency 1 (in-process smollm2-135m)" in line


def test_api_orchestrator_without_keys_still_gets_local_experts(monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    args, line = resolved("hle", "--data", "hle.jsonl", "--model", "Qwen3-8B")
    assert args.profile == "local" and "profile local (no OPENAI_API_KEY set)" in line
    # the experts are the in-process model: tasks must not share it 16 ways
    assert args.concurrency == 1 and (args.max_turns, args.max_tokens) == (50, 1024)


def test_with_keys_and_paper_profile_the_papers_setting(monkeypatch):
    for key in KEYS:
        monkeypatch.setenv(key, "sk-test")
    for extra in ([], ["--profile", "paper"]):
        args, line = resolved("hle", "--data", "hle.jsonl", "--model", "Qwen3-8B", *extra)
        assert args.profile == "paper" and args.constrained is False
        # configs/profiles/paper.yaml qa.hle: upstream's 12k orchestrator tokens, per-expert budgets
        assert (args.max_turns, args.max_tokens, args.expert_max_tokens) == (50, 12000, None)
        assert args.concurrency == 16 and args.judge_model == "gpt-5" and args.judge_style == "upstream"
        assert "profile budgets" in line


def test_explicit_flags_win(monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    args, _ = resolved("frames", "--concurrency", "3", "--max-turns", "9", "--no-constrained", "--judge-model", "exact")
    assert (args.concurrency, args.max_turns, args.constrained, args.judge_model) == (3, 9, False, "exact")
    assert args.profile == "local"
