"""Function-calling (tau2-style) tasks in the loop and the trainer (issue #4 item 4, #6).

Domains come from the offline pipeline on the shipped `school` schema (and, when present,
the shared ToolScale databases).  A scripted policy replaying the gold actions scores 1,
a wrong one 0, and our comparison gives tau2's own verdict; call_expert executes the
expert's proposal; a tiny random policy under grammar-constrained decoding emits valid
calls whose tool results stay out of the trained tokens; a mixed QA + tau2 file trains.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _tau2_world import build_world, policy_texts, scripted_runtime
from _train_world import build_policy, overrides
from safetensors.torch import load_file

from data_synthesis.offline import build_domain, resolve_source
from data_synthesis.tasks import task_meta
from orchestrator.catalog import load_catalog
from orchestrator.domains.outcome import result_text
from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.policy import PolicyOutput
from orchestrator.records import Rollout, Turn, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import format_tool_call
from training.scoring import score_groups
from training.tasks import load_tasks

TOOLSCALE = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks" / "toolscale" / "domains"
EVALUATORS = ("builtin", "tau2")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("tau2world"))


@pytest.fixture(scope="module")
def tiny_policy(world, tmp_path_factory):
    return build_policy(tmp_path_factory.mktemp("policy") / "policy", policy_texts(world["school"]),
                        max_positions=8192, vocab_size=4000)


class Scripted:
    """A policy that emits the given (tool, arguments) calls in order."""

    price_model = "Qwen3-8B"

    def __init__(self, calls):
        self.calls = list(calls)
        self.seen: list[list[dict]] = []

    def act(self, messages, tools, **kw):
        self.seen.append(messages)
        name, args = self.calls.pop(0)
        return PolicyOutput(text=format_tool_call(name, args), usage=Usage(100, 20), latency=0.0)


def _tau2_tasks(world) -> list[Task]:
    return [t for t in load_tasks([str(world["train"])]) if t.kind == "tau2"]


def _task_for(domain_dir: Path, tau2_task: dict) -> Task:
    return Task(id=tau2_task["id"], question="", kind="tau2", tools={"call_expert": {"expert-1": "gpt-5"}},
                metadata={"tau2_task": tau2_task, "domain_dir": str(domain_dir)})


def _gold(task: Task):
    crit = task.metadata["tau2_task"]["evaluation_criteria"]
    said = "Here you go: " + ", ".join(crit.get("communicate_info") or [])
    return [(a["name"], a["arguments"]) for a in crit["actions"]], said


def _episode(task, calls, evaluator, runtime=None, max_turns=12):
    runtime = runtime or ToolRuntime(catalog=load_catalog())
    return run_episode(task, Scripted(calls), runtime, LoopConfig(max_turns=max_turns, tau2_evaluator=evaluator, tau2_user="solo"))


def _check_gold_one_wrong_zero(tasks: list[Task]) -> None:
    kinds = set()
    for task in tasks:
        gold, said = _gold(task)
        kind = task_meta(task.metadata["tau2_task"])["kind"]
        kinds.add(kind)
        wrong = gold[:-1] + [("done", {"message": said})] if kind == "write" else gold + [("done", {"message": "No."})]
        verdicts = {}
        for evaluator in EVALUATORS:
            right = _episode(task, gold + [("done", {"message": said})], evaluator)
            bad = _episode(task, wrong, evaluator)
            assert (right.finished, right.stop_reason, right.outcome) == (True, "done", 1.0), (task.id, right.info)
            assert (bad.finished, bad.outcome) == (True, 0.0), (task.id, bad.info)
            assert right.info["evaluator"] == evaluator
            verdicts[evaluator] = [{k: v for k, v in r.info.items() if k != "evaluator"} for r in (right, bad)]
        assert verdicts["builtin"] == verdicts["tau2"], task.id   # same reward, db match, communicated
    assert kinds == {"read", "write"}


def test_school_gold_scores_one_wrong_scores_zero_and_our_verdict_is_tau2s(world):
    _check_gold_one_wrong_zero(_tau2_tasks(world))


@pytest.mark.skipif(not TOOLSCALE.is_dir(), reason=f"{TOOLSCALE} absent (the shared ToolScale domains, ../shared)")
@pytest.mark.parametrize("name", ["bank", "movie"])
def test_toolscale_gold_scores_one_wrong_scores_zero_and_our_verdict_is_tau2s(tmp_path, name):
    if not (TOOLSCALE / name).is_dir():
        pytest.skip(f"{TOOLSCALE / name} absent")
    build_domain(resolve_source(TOOLSCALE / name, seed=0), tmp_path, num_tasks=8, seed=0)
    tasks = [_task_for(tmp_path, t) for t in json.loads((tmp_path / "tasks.json").read_text())]
    reads = [t for t in tasks if task_meta(t.metadata["tau2_task"])["kind"] == "read"][:2]
    writes = [t for t in tasks if task_meta(t.metadata["tau2_task"])["kind"] == "write"][:2]
    _check_gold_one_wrong_zero(reads + writes)


def test_tool_results_read_as_tau2_writes_them():
    from tau2.environment.environment import Environment

    for value in ["text", None, 3, 2.5, True, ["a", 1, None], {"id": "X1", "n": 2, "ok": False, "sub": {"x": [1.5]}},
                  [{"a": (1, 2)}], {}]:
        assert result_text(value) == Environment.to_json_str(value), value


def test_call_expert_executes_the_experts_proposal(world):
    runtime = scripted_runtime(world["school"])
    task = next(t for t in _tau2_tasks(world) if len(t.tools["call_expert"]) > 1)
    aliases = task.tools["call_expert"]                      # alias -> model, randomised per example
    strong = next((a for a, m in aliases.items() if m in ("gpt-5", "gpt-5-mini")), None)
    weak = next((a for a, m in aliases.items() if m not in ("gpt-5", "gpt-5-mini")), None)
    gold, _ = _gold(task)
    if strong:
        r = _episode(task, [("call_expert", {"expert": strong})] * (len(gold) + 1), "builtin", runtime)
        assert (r.finished, r.outcome) == (True, 1.0)
        assert [t.action.name for t in r.turns] == [name for name, _ in gold] + ["done"]
        assert all(t.expert.alias == strong and t.expert.cost > 0 for t in r.turns)
        assert r.tool_calls == {strong: len(gold) + 1}
        assert r.cost == pytest.approx(sum(t.policy_cost + t.expert.cost for t in r.turns))
        assert r.turns[0].observation.startswith(f"[{strong} called {gold[0][0]}(")
    if weak:
        r = _episode(task, [("call_expert", {"expert": weak})], "builtin", runtime)
        assert (r.finished, r.outcome, r.final_answer) == (True, 0.0, "I cannot help with that.")


def test_invalid_calls_are_recorded_not_executed_and_answered_with_the_error(world):
    task = _tau2_tasks(world)[0]
    gold, said = _gold(task)
    policy = Scripted([("no_such_tool", {}), (gold[0][0], {**gold[0][1], "bogus": 1}), ("call_expert", {"expert": "expert-9"}),
                       ("transfer_to_human_agents", {"summary": "x"})] + gold + [("done", {"message": said})])
    r = run_episode(task, policy, ToolRuntime(catalog=load_catalog()), LoopConfig(max_turns=20, tau2_evaluator="builtin", tau2_user="solo"))
    assert [t.valid for t in r.turns[:4]] == [False] * 4
    assert "unknown tool 'no_such_tool'" in r.turns[0].invalid_reason
    assert "unknown argument(s) ['bogus']" in r.turns[1].invalid_reason
    assert "must be one of" in r.turns[2].invalid_reason
    assert "unknown tool 'transfer_to_human_agents'" in r.turns[3].invalid_reason   # replaced by call_expert
    assert all(t.action is None for t in r.turns[:4])
    assert "unknown tool 'no_such_tool'" in policy.seen[1][-1]["content"]            # the error is in the next context
    assert r.outcome == 1.0     # the invalid calls changed nothing


def test_tau2_outcome_comes_from_the_environment_not_the_qa_judge():
    task = Task(id="t", question="", kind="tau2", preference={"outcome": 1.0, "cost": 1.0})
    group = [Rollout(task_id="t", finished=True, outcome=o, kind="tau2", turns=[Turn(index=0, policy_cost=c)])
             for o, c in ((1.0, 3.0), (0.0, 1.0), (1.0, 1.0))]
    group.append(Rollout(task_id="t", finished=False, kind="tau2"))
    scored = score_groups([task], [group], judge=lambda task, r: False, min_group_std=0.0)
    assert [r.outcome for r in group] == [1, 0, 1, 0]          # the judge (always False) was not asked
    # the whole group, the unfinished rollout (cost 0) at outcome 0: outcome (1, 0, 1, 0);
    # -cost (-3, -1, -1, 0) -> (0, 2/3, 2/3, 1); R = outcome + cost if outcome else 0
    assert scored.rewards == [pytest.approx([1.0, 0.0, 5 / 3, 0.0])]
    assert [r.reward for r in group] == pytest.approx([1.0, 0.0, 5 / 3, 0.0])
    assert group[3] not in scored.rollouts and len(scored.rollouts) == 3


def test_trainer_loads_synthesised_records_and_names_a_missing_domain(world, tmp_path):
    tasks = load_tasks([str(world["train"])])
    assert {t.kind for t in tasks} == {"qa", "tau2"}
    for t in (t for t in tasks if t.kind == "tau2"):
        assert Path(t.metadata["domain_dir"]) == world["school"].resolve()
        assert t.tools.keys() == {"call_expert"} and t.metadata["tau2_task"]["evaluation_criteria"]["actions"]
    moved = tmp_path / "train.jsonl"          # the same rows away from the domain: "../school" is gone
    moved.write_text(world["train_jsonl"].read_text())
    with pytest.raises(ValueError, match=r"train\.jsonl\[0\]: task school/\S+: metadata\.domain_dir .* is not a folder"):
        load_tasks([str(moved)])


def test_grammar_constrained_tiny_policy_emits_valid_calls_and_trains_only_its_own_tokens(world, tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.policy import TokenPolicy
    from orchestrator.engines.hf import HFEngine
    from training.samples import build_turn_samples
    from orchestrator.episodes.tau2_solo import task_grammar
    from training.rollouts import SeededEngine, mask_forced_tokens

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_policy), tok, device="cpu")
    runtime = scripted_runtime(world["school"])
    task = _tau2_tasks(world)[0]
    config = LoopConfig(max_turns=4, max_tokens=400, constrained=True, tau2_evaluator="builtin", tau2_user="solo")
    rollouts = [run_episode(task, TokenPolicy(SeededEngine(engine, seed), "Qwen3-8B"), runtime, config)
                for seed in (1, 2)]
    turns = [t for r in rollouts for t in r.turns]
    assert turns and all(t.valid for t in turns), [t.invalid_reason for t in turns]   # grammar: every call valid
    assert all(t.constraint == {"grammar": task_grammar(task, runtime.catalog)} for t in turns)  # recorded
    mask_forced_tokens([[r] for r in rollouts], tok)
    for t in turns:     # the closing EOS was forced, the tool name was a choice, much was forced
        assert t.loss_mask[-1] == 0 and 0 < sum(t.loss_mask) < len(t.response_ids)
    samples = build_turn_samples(rollouts, [1.0, -1.0])
    observed = [(r.turns[i], r.turns[i + 1]) for r in rollouts for i in range(len(r.turns) - 1) if r.turns[i].observation]
    checked = 0
    for before, after in observed:
        result = before.observation.split("\n")[-1][:40]
        if len(result) < 8:
            continue        # too short to tell apart from a random argument
        assert result in tok.decode(after.prompt_ids)                          # the result is read next turn ...
        trained = [s for s in samples if s.prompt_ids == after.prompt_ids or s.prompt_ids == before.prompt_ids]
        for s in trained:                                                      # ... and never trained on
            assert result not in tok.decode([i for i, m in zip(s.response_ids, s.loss_mask) if m])
            assert result not in tok.decode(s.response_ids)
        checked += 1
    assert checked, "no tool result long enough to check was executed"


@pytest.mark.slow
def test_mixed_qa_and_tau2_run_trains_and_logs_tau2_rewards(world, tiny_policy, tmp_path):
    from training.checkpoint import list_checkpoints
    from training.config import load_config
    from training.metrics_log import read_metrics
    from training.session import run

    cfg = load_config(None, overrides(tmp_path, tiny_policy, world["train"], **{
        "rollout.tasks_per_step": 4, "rollout.max_turns": 3, "rollout.max_tokens": 96, "rollout.context_tokens": 12000,
        "algorithm.micro_batch_size": 2, "logging.rollouts_every": 1, "run.seed": 1,
        "rollout.tau2_user": "solo"}))   # the scripted experts play the solo episode
    run(cfg, runtime=scripted_runtime(world["school"]))
    found = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in found] == ["step-00000001", "step-00000002"]
    before = load_file(str(tiny_policy / "model.safetensors"))
    after = load_file(str(found[-1] / "model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(m["train/samples"] > 0 for m in metrics)
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    for kind in ("qa", "tau2"):
        of_kind = [r for r in rollouts if r["kind"] == kind]
        assert of_kind, f"no {kind} task was sampled"
        steps = {r["step"] for r in of_kind}
        for m in (m for m in metrics if m["step"] in steps):
            rows = [r for r in of_kind if r["step"] == m["step"]]
            assert m[f"rollout/accuracy_{kind}"] == pytest.approx(sum(r["outcome"] for r in rows) / len(rows))
            rewards = [r["reward"] for r in rows if r["reward"] is not None]
            assert m[f"reward/mean_{kind}"] == pytest.approx(sum(rewards) / max(1, len(rewards)))
    tau2_done = [r for r in rollouts if r["kind"] == "tau2" and r["finished"]]
    assert tau2_done and all(r["info"]["evaluator"] == "tau2" and r["outcome"] == r["info"]["reward"]
                             for r in tau2_done)


def test_an_invalid_expert_proposal_is_recorded_and_not_executed(world):
    from orchestrator.records import LLMResponse, ToolCall

    task = _tau2_tasks(world)[0]
    alias = next(iter(task.tools["call_expert"]))
    proposals = iter([ToolCall("call_expert", {"expert": alias}), ToolCall("drop_table", {}), None])

    def llm(model, messages, **kw):
        call = next(proposals)
        return LLMResponse(model=model, text="I would rather chat.", tool_calls=[call] if call else [],
                           usage=Usage(50, 5))

    runtime = ToolRuntime(catalog=load_catalog(), llm=llm)
    r = _episode(task, [("call_expert", {"expert": alias})] * 3, "builtin", runtime, max_turns=3)
    assert [t.valid for t in r.turns] == [True] * 3 and all(t.action is None for t in r.turns)
    assert "invalid proposal: unknown tool 'call_expert'" in r.turns[0].expert.error   # experts get no call_expert
    assert "invalid proposal: unknown tool 'drop_table'" in r.turns[1].expert.error
    assert "proposed no tool call" in r.turns[2].expert.error
    assert all(t.expert.cost > 0 for t in r.turns) and not r.finished and r.stop_reason == "max_turns"


def test_transcript_drops_the_oldest_tool_output_first_when_over_budget():
    from orchestrator.context import Budgets, TokenCounter
    from orchestrator.episodes.tau2_solo import OMITTED, Transcript

    counter = TokenCounter()                                  # ~4 characters per token
    t = Transcript("s" * 40, "r" * 40, Budgets(doc_tokens=25, context_tokens=10_000), counter)
    for i in range(3):
        t.add(f"call {i}", str(i) * 400)                     # each output cut to 25 tokens = 100 chars
    full = t.fit()
    assert [m["content"].count(str(i)) for i, m in zip(range(3), full[3::2])] == [100, 100, 100]
    total = sum(counter.count(m["content"]) for m in full)
    t.budgets = Budgets(doc_tokens=25, context_tokens=total - 1)     # one output too many
    cut = t.fit()
    assert [m["content"] for m in cut[3::2]][:1] == [OMITTED] and cut[5:] == full[5:]
    assert cut[:3] == full[:3]                                # system, request, first call kept


def test_grammar_decision_mask_counts_the_admitted_tokens(tiny_policy, world):
    import random

    from transformers import AutoTokenizer

    from orchestrator.domains.folder import load_domain
    from orchestrator.episodes.tau2_solo import episode_tools
    from orchestrator.toolcall import call_grammar
    from orchestrator.engines.grammar import token_grammar

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    tg = token_grammar(tok, len(tok), [tok.eos_token_id])
    ids = tok("x", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert len(ids) == 2 and tg.decision_mask('root ::= "x"', ids) == [0, 0]     # one token, then EOS: forced
    assert tg.decision_mask('root ::= "x" | "y"', ids) == [1, 0]                 # a choice, then forced
    grammar = call_grammar(episode_tools(load_domain(world["school"]), load_catalog())[0])
    rng = random.Random(0)
    for _ in range(3):                                      # random sentences: the mask is "> 1 admitted"
        matcher, sample, brute = tg.matcher(grammar), [], []
        while not matcher.is_terminated() and len(sample) < 300:
            admitted = tg.allowed(matcher).nonzero().flatten().tolist()
            brute.append(int(len(admitted) > 1))
            sample.append(rng.choice(admitted))
            matcher.accept_token(sample[-1])
        assert tg.decision_mask(grammar, sample) == brute
        assert 0 < sum(brute) < len(brute)


def test_rollout_max_string_chars_sets_the_grammar_cap_and_the_mask_replay_uses_it(world, tiny_policy, tmp_path):
    """rollout.max_string_chars reaches the grammar a call is decoded under and the grammar its
    decision mask is replayed with: a call with an 80-character argument is refused by the
    default cap (64) and admitted by 100, and its replay under 100 ends in forced tokens (the
    closing text and EOS), where under 64 the rejected tail counts as choices."""
    from transformers import AutoTokenizer
    from xgrammar.testing import _is_grammar_accept_string

    from orchestrator.domains.folder import load_domain
    from orchestrator.episodes.tau2_solo import episode_tools, task_grammar
    from orchestrator.toolcall import call_grammar
    from training.config import ConfigError, load_config
    from training.rollouts import mask_forced_tokens

    def free_strings(fn):       # the string arguments without an enum
        props = (fn.get("parameters") or {}).get("properties", {})
        return [k for k, p in props.items() if p.get("type") == "string" and "enum" not in p]

    task = _tau2_tasks(world)[0]
    tools = episode_tools(load_domain(world["school"]), load_catalog())[0]
    fn = next(s["function"] for s in tools if free_strings(s["function"])
              and set(s["function"]["parameters"].get("required", [])) <= set(free_strings(s["function"])))
    text = format_tool_call(fn["name"], {k: "x" * 80 for k in free_strings(fn)})
    assert not _is_grammar_accept_string(call_grammar(tools), text)
    assert _is_grammar_accept_string(call_grammar(tools, 100), text)
    assert task_grammar(task, load_catalog(), 100) != task_grammar(task, load_catalog())
    with pytest.raises(ValueError, match="max_string_chars"):
        call_grammar(tools, 0)

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    masks = {}
    for cap in (None, 100):     # the turn records the grammar it was decoded under; the replay uses it
        grammar = task_grammar(task, load_catalog(), *([cap] if cap else []))
        rollout = Rollout(task_id=task.id, kind="tau2",
                          turns=[Turn(index=0, prompt_ids=[1], response_ids=list(ids), loss_mask=[1] * len(ids),
                                      constraint={"grammar": grammar})])
        mask_forced_tokens([[rollout]], tok)
        masks[cap] = rollout.turns[0].loss_mask
    assert masks[100][-1] == 0 and masks[None][-1] == 1
    with pytest.raises(ConfigError, match="rollout.max_string_chars"):
        load_config(None, overrides(tmp_path, tiny_policy, world["train"], **{"rollout.max_string_chars": 0}))
