"""The learning quickstart's pieces: its world, its catalog, and warm-up turns that match the loop."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.context import Budgets, Prompts
from orchestrator.engines.interface import Generation
from orchestrator.loop import LoopConfig, run_episode
from orchestrator.policy import TokenPolicy
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import QASettings, RetrievalSettings
from orchestrator.toolcall import allowed_call_strings
from training.quickstart.env import (ANSWER_ALIASES, FAVOUR_TRAIN_ALIASES, FAVOURED_ALIAS, MAIN_PRESET, PARAPHRASES,
                                     PRESETS, PROMPTS_DIR,
                                     SEARCH_DEPTH, TOOL_ALIASES, TRAIN_MIX, UNSEEN_TOOLS, WORDINGS, RoutedRuntime,
                                     build_world, preference_vector, preference_words, question_kind,
                                     quickstart_catalog, task_tools, with_preference)
from training.quickstart.machine import KERNEL_FLAGS, cpu_flags
from training.tasks import load_tasks


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("qs")
    paths = build_world(out, n_train=12, n_eval=8, n_warmup=6, n_people=40)
    return paths, load_catalog(quickstart_catalog(out))


def test_train_and_held_out_tasks_are_disjoint_and_balanced(world):
    paths, _ = world
    train, held_out, warm = (load_tasks([str(paths[k])]) for k in ("train", "eval", "warmup"))
    assert (len(train), len(held_out), len(warm)) == (12, 8, 6)
    for a, b in ((train, held_out), (warm, held_out), (train, warm)):
        assert not {t.question for t in a} & {t.question for t in b}
    for split in (train, held_out, warm):
        kinds = [t.metadata["type"] for t in split]
        assert kinds.count("lookup") == kinds.count("arithmetic")
        assert all(set(t.tools) == set(TOOL_ALIASES) for t in split)
        # every task states its preference vector in words on the question's last line, in one of
        # the training wordings (never a held-out paraphrase); a favour task names its own alias
        for t in split:
            name, alias = t.metadata["preference_name"], t.metadata["favoured"]
            assert t.preference == preference_vector(name, alias)
            assert t.question.endswith("\n" + preference_words(name, t.metadata["wording"], alias))
            assert t.metadata["wording"] in range(len(WORDINGS[name]))
            assert not any(t.question.endswith(PARAPHRASES[p].format(alias=a)) for p in PARAPHRASES
                           for a in ANSWER_ALIASES)
    assert {t.metadata["preference_name"] for t in train + warm} <= set(TRAIN_MIX)
    # the favoured alias varies across the training favour tasks: only the words tell which one
    favoured = [t.metadata["favoured"] for t in train + warm if t.metadata["preference_name"] == "favour"]
    assert set(favoured) == set(FAVOUR_TRAIN_ALIASES) and FAVOURED_ALIAS in FAVOUR_TRAIN_ALIASES
    assert max(favoured.count(a) for a in FAVOUR_TRAIN_ALIASES) - min(
        favoured.count(a) for a in FAVOUR_TRAIN_ALIASES) <= 2
    # presets are drawn per question kind as exact shares: each preset lands on each kind,
    # however the kinds fell in a small split
    for split in (train, warm):
        by_kind: dict = {}
        for t in split:
            by_kind.setdefault(question_kind(t), []).append(t.metadata["preference_name"])
        for kind, names in by_kind.items():
            for preset, share in TRAIN_MIX.items():
                assert abs(names.count(preset) - share * len(names)) < 1, (kind, names)
    assert {t.metadata["preference_name"] for t in held_out} == {MAIN_PRESET}
    docs = {json.loads(line)["id"] for line in paths["corpus"].read_text().splitlines()}
    assert all(t.metadata["doc_id"] in docs for t in train + held_out if t.metadata["type"] == "lookup")


@pytest.mark.parametrize("sizes", [(16, 64, 16), (10, 6, 14)])
def test_balanced_kinds_give_each_split_as_many_city_as_year_lookups_and_the_same_people(tmp_path, sizes):
    n_train, n_eval, n_warmup = sizes
    tasks = {}
    for balanced in (False, True):
        paths = build_world(tmp_path / str(balanced), n_train=n_train, n_eval=n_eval, n_warmup=n_warmup, n_people=80,
                            seed=1, balanced_kinds=balanced)
        tasks[balanced] = {k: load_tasks([str(paths[k])]) for k in ("train", "eval", "warmup")}
    for split, n in zip(("train", "eval", "warmup"), sizes):
        kinds = [question_kind(t) for t in tasks[True][split]]
        assert (kinds.count("city"), kinds.count("year"), kinds.count("arithmetic")) == (
            n // 2 - n // 4, n // 4, n - n // 2), split
    # the same people are asked about: which of them asks the year (and where) moved
    people = {b: sorted(t.metadata["doc_id"] for ts in tasks[b].values() for t in ts if "doc_id" in t.metadata)
              for b in tasks}
    assert people[False] == people[True]


def test_quickstart_catalog_keeps_tools_aliases_and_every_price(world):
    _, catalog = world
    base = load_catalog()
    assert catalog.prices == base.prices and catalog.fees == base.fees
    for tool in base.tools:
        assert catalog.tool(tool.name).aliases == tool.aliases
    # the favoured alias is the priciest of its (equally able) answer aliases: only the preference makes it the best
    usage = Usage(100, 20)
    served = task_tools()["answer"]          # the tasks' alias -> model mapping (TASK_MODELS over tools.json)
    answer = {a: catalog.llm_cost(served[a], usage) for a in TOOL_ALIASES["answer"]}
    assert max(answer, key=answer.get) == FAVOURED_ALIAS
    assert all(t.tools["answer"] == served for t in load_tasks([str(world[0]["train"])]))


class _Retriever:
    def __init__(self, corpus):
        self.docs = [json.loads(line) for line in corpus.read_text().splitlines()]

    def retrieve(self, queries, topk):
        name = queries[0].split(" was ")[1].split(" born")[0]
        doc = next(d for d in self.docs if d["contents"].startswith(name))
        return [[{"document": doc, "score": 1.0}]]


def test_warmup_turns_are_exactly_what_the_loop_feeds_and_records(world):
    """Demonstrations must match run time token for token, or the warm-up teaches another task."""
    from training.quickstart.warmup import demonstrations
    from training.tiny_policy import tiny_tokenizer

    paths, catalog = world
    tasks = load_tasks([str(paths["train"])])
    lookup = next(t for t in tasks if t.metadata["type"] == "lookup")
    arith = next(t for t in tasks if t.metadata["type"] == "arithmetic")
    tok = tiny_tokenizer(allowed_call_strings(TOOL_ALIASES) * 20 + [t.question for t in tasks], 600)
    prompts, budgets = Prompts.load(PROMPTS_DIR), Budgets(context_tokens=2048)
    retriever = _Retriever(paths["corpus"])
    demos = demonstrations([lookup, arith], tok, catalog, retriever, prompts=prompts, budgets=budgets, topk=1)
    calls = [json.loads(tok.decode(d.response_ids, skip_special_tokens=True).split("\n")[1]) for d in demos]
    assert [(c["name"], c["arguments"]["model"]) for c in calls] == [
        ("search", "search-1"), ("answer", "answer-1"), ("enhance_reasoning", "reasoner-1"), ("answer", "answer-1")]
    assert all(d.response_ids[-1] == tok.eos_token_id for d in demos)
    # targets only where constrained decoding leaves a choice: the tool name (certain) and the
    # alias (uniform over the tool's aliases)
    n = {tool: len(aliases) for tool, aliases in TOOL_ALIASES.items()}
    for d, n_aliases in zip(demos, (n["search"], n["answer"], n["enhance_reasoning"], n["answer"])):
        (tool_pos, tool_target), (alias_pos, alias_target) = sorted(d.targets.items())
        assert tool_target == {d.response_ids[tool_pos]: 1.0}
        assert sorted(alias_target.values()) == [1 / n_aliases] * n_aliases
        assert d.response_ids[alias_pos] in alias_target

    class Replay:                         # an engine answering with the demonstrated calls
        tokenizer = tok

        def __init__(self, turns):
            self.turns, self.seen = list(turns), []

        def generate(self, prompt_ids, params):
            self.seen.append(prompt_ids[0])
            demo = self.turns.pop(0)
            return [Generation(demo.response_ids, [0.0] * len(demo.response_ids),
                               tok.decode(demo.response_ids, skip_special_tokens=True))]

    expression = arith.question.split("What is ")[1].split("?")[0]

    def llm(model, messages, **kw):   # the code expert writes what the demonstration assumes
        text = f"```python\nprint({expression})\n```" if "Python" in messages[0]["content"] else "x"
        return LLMResponse(model=model, text=text, usage=Usage(10, 5))

    def run_code(code, timeout):
        return SimpleNamespace(stdout=arith.answer, stderr="", exit_code=0, timed_out=False, duration_s=0.0)

    for task, turns in ((lookup, demos[:2]), (arith, demos[2:])):
        engine = Replay(turns)
        runtime = ToolRuntime(catalog=catalog, retriever=retriever, prompts=prompts, budgets=budgets,
                              sections={"qa": QASettings(retrieval=RetrievalSettings(topk=1))},
                              llm=llm, run_code=run_code)
        rollout = run_episode(task, TokenPolicy(engine, "Qwen3-8B"), runtime,
                              LoopConfig(max_turns=2, constrained=True, budgets=budgets))
        assert engine.seen == [t.prompt_ids for t in turns]
        assert [t.response_ids for t in rollout.turns] == [t.response_ids for t in turns]


def test_checks_hold_only_where_the_interval_clears_the_thresholds_wrong_side():
    from training.quickstart.run import checks

    def ci(estimate, low, high):
        return {"estimate": estimate, "low": low, "high": high, "width": high - low}

    good = {"accuracy_gain": ci(0.10, 0.02, 0.18), "cost_ratio": ci(0.55, 0.45, 0.7),
            "share_rise_favour": ci(0.4, 0.2, 0.6), "share_rise_favour_paraphrase": ci(0.3, 0.1, 0.5),
            "share_rise_accuracy": ci(0.05, -0.05, 0.15), "share_rise_cost": ci(-0.2, -0.3, -0.1),
            "share_rise_accuracy_paraphrase": ci(0.0, 0.0, 0.0), "share_rise_cost_paraphrase": ci(0.08, -0.02, 0.18)}
    assert checks(good) == {"accuracy_up_5_points": True, "cost_at_least_40pct_lower": True,
                            "favoured_share_rises_when_favoured": True, "favoured_share_not_rising_otherwise": True}
    bad = {**good, "accuracy_gain": ci(0.10, -0.01, 0.2),          # +10 points, but the interval holds 0
           "cost_ratio": ci(0.62, 0.5, 0.8),                       # a 38% cut
           "share_rise_favour_paraphrase": ci(0.1, -0.02, 0.3),    # not on the unseen paraphrase
           "share_rise_cost": ci(0.1, 0.01, 0.2)}                  # rises where not favoured
    assert not any(checks(bad).values())
    assert not checks({**good, "cost_ratio": ci(0.55, 0.3, 1.01)})["cost_at_least_40pct_lower"]
    assert not checks({**good, "accuracy_gain": ci(0.04, 0.01, 0.08)})["accuracy_up_5_points"]
    # every unfamiliar sentence given to the favoured alias: the cost paraphrase's share rises too
    # (upper bound 0.53 > width 0.25), so the favour paraphrase's rise was not read
    assert not checks({**good, "share_rise_cost_paraphrase": ci(0.41, 0.28, 0.53)})["favoured_share_not_rising_otherwise"]
    assert not checks({**good, "share_rise_accuracy_paraphrase": ci(0.3, 0.2, 0.4)})["favoured_share_not_rising_otherwise"]


def test_cheap_search_aliases_read_the_shallow_index_and_the_deep_one_the_full_biographies(world):
    """Aliases differ in capability: search-1 / search-2 see only name and birth city (a year
    question fails there), search-3 (served per task as Qwen3-32B) the full passage; each call on its
    own runtime copy."""
    paths, catalog = world
    places = {json.loads(line)["id"]: json.loads(line)["contents"] for line in paths["places"].read_text().splitlines()}
    corpus = {json.loads(line)["id"]: json.loads(line)["contents"] for line in paths["corpus"].read_text().splitlines()}
    assert places.keys() == corpus.keys()
    person = next(iter(corpus))
    year = corpus[person].split(" in ")[-1].split(".")[0]
    assert year.isdigit() and year in corpus[person] and year not in places[person]

    class Fixed:
        def __init__(self, docs):
            self.docs = docs

        def retrieve(self, queries, topk):
            return [[{"document": {"id": person, "contents": self.docs[person]}, "score": 1.0}]]

    seen = []

    def llm(model, messages, **kw):
        seen.append(messages[-1]["content"])
        return LLMResponse(model=model, text="<query>x</query>", usage=Usage(10, 5))

    from orchestrator.context import EpisodeState
    from orchestrator.loop import Task
    runtime = RoutedRuntime(catalog=catalog, prompts=Prompts.load(PROMPTS_DIR), llm=llm, retriever=None,
                            overrides={"search-3": {"retriever": Fixed(corpus)}, "search-2": {"retriever": Fixed(places)}})
    for alias, has_year in (("search-3", True), ("search-2", False)):
        state = EpisodeState(with_preference(Task("t", "In which year was X born?"), "favour").question)
        call, _ = runtime.call("search", alias, state)
        assert call.error is None and (year in state.documents[0].contents) is has_year
        assert "Preference" not in seen[-1]           # the expert reads the problem, not the preference
    assert runtime.retriever is None            # the shared runtime itself is never changed
    assert SEARCH_DEPTH["search-3"] == "deep" and SEARCH_DEPTH["search-1"] == SEARCH_DEPTH["search-2"] == "shallow"
    assert task_tools()["search"] == {"search-1": "Qwen3-8B", "search-2": "gpt-5-mini", "search-3": "Qwen3-32B"}
    assert all(a in SEARCH_DEPTH for a in UNSEEN_TOOLS["search"])


def test_unseen_tools_share_nothing_with_training(world):
    paths, catalog = world
    seen_aliases = {a for aliases in TOOL_ALIASES.values() for a in aliases}
    seen_models = {m for aliases in task_tools().values() for m in aliases.values()}
    for aliases in UNSEEN_TOOLS.values():
        assert not set(aliases) & seen_aliases and not set(aliases.values()) & seen_models
        for model in aliases.values():
            assert catalog.served_model(model, "local") == "smollm2-135m"   # served locally, priced as itself
    task = load_tasks([str(paths["eval"])])[0]
    unseen = with_preference(task, "favour", tools=UNSEEN_TOOLS)
    assert unseen.tools == UNSEEN_TOOLS and unseen.question.count("Preference:") == 1


def test_the_world_is_the_data_synthesis_people_domain(tmp_path):
    """The quickstart's people are the records `data_synthesis.synthesize --domain-dir people`
    writes to that domain's db.json (issue #6: the embedded default comes from the pipeline)."""
    from data_synthesis.synthesize import main as synthesize
    from data_synthesis.toyworld import build_people

    assert synthesize(["--domain-dir", "people", "--out", str(tmp_path / "people"), "--num-tasks", "5",
                       "--seed", "3"]) == 0
    db = json.loads((tmp_path / "people" / "db.json").read_text())["people"]
    people = build_people(60, seed=3)
    assert len({p.name for p in people}) == 60
    for p in people:
        rec = db[p.id]
        assert (p.name, p.city, p.year, p.occupation) == (
            f"{rec['first_name']} {rec['last_name']}", rec["birth_city"], rec["birth_year"], rec["occupation"])
    corpus = build_world(tmp_path / "w", n_train=4, n_eval=2, n_people=60, seed=3)["corpus"]
    passages = {json.loads(line)["id"]: json.loads(line)["contents"] for line in corpus.read_text().splitlines()}
    assert passages[people[0].id].startswith(f"{people[0].name}\n{people[0].name} was born in {people[0].city}")


@pytest.mark.slow
def test_quickstart_end_to_end_writes_both_blocks_and_the_plot(tmp_path, monkeypatch):
    """`make quickstart`'s stages, shrunk: world, warm-up, initial evals, one GRPO step, final evals,
    summary.json with `initial`/`final` rows per preference over the same held-out tasks, and the PNG."""
    from training.quickstart.reading import separation
    from training.quickstart.run import EVAL_RUNS, eval_runs, main
    from training.quickstart.warm_start import PROBE_LINES

    out = tmp_path / "qs"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")     # a GPU host: the CPU run hides its GPUs
    assert main(["--out", str(out), "--train-tasks", "4", "--eval-tasks", "2", "--warmup-tasks", "2",
                 "--warmup-epochs", "1", "--warmup-tries", "2", "--unread-words", "2", "--eval-concurrency", "2",
                 "--eval-samples", "2", "trainer.total_steps=1",
                 "rollout.tasks_per_step=2", "rollout.rollouts_per_task=2", "logging.wandb=disabled"]) == 0
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    summary = json.loads((out / "summary.json").read_text())
    # the run's flags, so that two runs' summaries say how their recipes differ
    assert (summary["flags"]["unread_words"], summary["flags"]["warmup_tries"], summary["flags"]["out"]) == (2, 2, str(out))
    assert summary["flags"]["seeds"] == [0]             # the seeds run, not the parser's count marker ([-1])
    for block in ("initial", "final"):          # one row per test-time preference + the unseen tools
        for row in summary[block].values():
            assert {"accuracy", "cost_per_task", "latency_per_task", "tool_calls_per_task", "favoured_share"} <= set(row)
            assert row["cost_per_task"] > 0 and row["tasks"] == 4
    assert summary["eval_tasks"] == 2 and set(summary["checks"]) == {
        "cost_at_least_40pct_lower", "accuracy_up_5_points", "favoured_share_rises_when_favoured",
        "favoured_share_not_rising_otherwise"}
    assert set(summary["final"]) == set(EVAL_RUNS) and set(summary["preference_scores"]) == set(PRESETS)
    assert set(summary["intervals"]) == {"accuracy_gain", "cost_ratio",
                                         *(f"share_rise_{n}" for n in EVAL_RUNS if n != "unseen_tools")}
    eval_tasks = load_tasks([str(out / "world" / "eval.jsonl")])
    for tag in ("initial", "final"):
        for name, tasks in eval_runs(eval_tasks).items():
            rows = [json.loads(line) for line in (out / f"eval_{tag}_{name}.jsonl").read_text().splitlines()]
            # two episodes per task (--eval-samples 2), each task's in a row
            assert [r["question"] for r in rows] == [t.question for t in tasks for _ in range(2)]
            assert [r["task_id"] for r in rows] == [t.id for t in tasks for _ in range(2)]
    # the paraphrase runs state each preference in words no training task used
    train_questions = {t.question for t in load_tasks([str(out / "world" / "train.jsonl")])}
    assert all(PARAPHRASES[p].format(alias=FAVOURED_ALIAS) in t.question for p in PRESETS
               for t in eval_runs(eval_tasks)[f"{p}_paraphrase"])
    assert not any(PARAPHRASES[p].format(alias=a) in q for p in PRESETS for a in ANSWER_ALIASES for q in train_questions)
    # the intervals are recomputed from the saved trajectories alone
    assert main(["--recompute", str(out)]) == 0
    # the favour line's reading after the warm-up and after GRPO: probabilities, per line read
    assert set(summary["reading"]) == {"warm", "final"}
    assert all(set(r) == {"favour", "favour_paraphrase", "favour_other_alias", "cost", "cost_paraphrase", "accuracy",
                          "accuracy_paraphrase", *PROBE_LINES}
               and all(0 < p < 1 for p in r.values()) for r in summary["reading"].values())
    # the warm-up tried again while its start did not tell the lines apart on the warm-up's own
    # tasks: the same initialisation with the retry's favour boost, stopping at the first that does
    tries = summary["warmup_tries"]
    assert [(t["seed"], t["favour_boost"]) for t in tries] == [(0, 0.5), (0, 0.65)][:len(tries)]
    assert all(t["separation"] < 0.25 for t in tries[:-1]) and (len(tries) == 2 or tries[-1]["separation"] >= 0.25)
    assert sum(t["kept"] for t in tries) == 1 and not list(out.glob("policy-warm-try*"))
    assert all(t["separation"] == separation(t["reading"], validation=True) and set(t["reading"]) == set(PROBE_LINES)
               for t in tries)
    assert (out / summary["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "train" / "metrics.jsonl").read_text().count("\n") == 1
    import torch
    import transformers
    packages = summary["machine"]["packages"]      # what the numbers ran on (they move with these)
    assert packages["torch"] == torch.__version__ and packages["transformers"] == transformers.__version__
    assert summary["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()   # AVX2 vs AVX512 runs differ
    assert summary["machine"]["cpu_model"]
    assert set(summary["machine"]["cpu_flags"]) <= set(KERNEL_FLAGS)


def _without_latencies(row):
    """A trajectory row less its wall-clock fields (the one thing a second process may change)."""
    if isinstance(row, dict):
        return {k: _without_latencies(v) for k, v in row.items() if "latency" not in k}
    return [_without_latencies(v) for v in row] if isinstance(row, list) else row


@pytest.mark.slow
def test_the_evaluations_in_second_processes_give_the_trajectories_they_give_in_turn(tmp_path):
    """--parallel-eval (the default) runs the initial evaluation in a spawned process while GRPO
    trains, and half the final one beside the other half: every held-out episode, before and
    after GRPO, and the GRPO metrics are what --no-parallel-eval's run in turn gives."""
    from training.quickstart.run import EVAL_RUNS, main

    flags = ["--train-tasks", "4", "--eval-tasks", "2", "--warmup-tasks", "2", "--warmup-epochs", "1",
             "--warmup-tries", "1", "--eval-concurrency", "2", "trainer.total_steps=1", "rollout.tasks_per_step=2",
             "rollout.rollouts_per_task=2", "logging.wandb=disabled"]
    for mode in ("parallel", "no-parallel"):
        assert main(["--out", str(tmp_path / mode), f"--{mode}-eval", *flags]) == 0
    files = sorted(p.name for p in (tmp_path / "parallel").glob("eval_*.jsonl"))
    assert len(files) == 14 and all((tmp_path / "parallel" / f"eval_{t}.log").exists() for t in ("initial", "final"))
    assert not list((tmp_path / "no-parallel").glob("eval_*.log"))
    for name in files:
        rows = [[_without_latencies(json.loads(line)) for line in (tmp_path / mode / name).read_text().splitlines()]
                for mode in ("parallel", "no-parallel")]
        assert rows[0] == rows[1] and rows[0], name
    metrics = [json.loads((tmp_path / m / "train" / "metrics.jsonl").read_text()) for m in ("parallel", "no-parallel")]
    clock = ("time", "rollout/latency")   # wall-clock; every other metric (rewards, calls, losses, KL, grad norm)
    assert metrics[0].keys() == metrics[1].keys()
    assert {k: v for k, v in metrics[0].items() if not k.startswith(clock)} \
        == {k: v for k, v in metrics[1].items() if not k.startswith(clock)}
    summaries = [json.loads((tmp_path / m / "summary.json").read_text()) for m in ("parallel", "no-parallel")]
    assert all({"initial evaluation", "GRPO", "final evaluation"} <= set(s["stage_seconds"]) for s in summaries)
    for tag in ("initial", "final", "intervals", "checks"):     # the halves' summaries merged in EVAL_RUNS' order
        assert _without_latencies(summaries[0][tag]) == _without_latencies(summaries[1][tag]), tag
    assert list(summaries[0]["final"]) == list(EVAL_RUNS)


@pytest.mark.slow
@pytest.mark.parametrize("separation, tried", [("1", 3), ("-1", 1)])
def test_warm_up_tries_in_pairs_are_the_tries_made_in_turn(tmp_path, separation, tried):
    """--parallel-warmup (the default) makes tries 1 and 2 at once, the second in a spawned
    process, then 3: the same tries, readings and kept policy as --no-parallel-warmup, whether no
    try separates (all three made, the best kept) or the first does (the second's folders gone)."""
    import hashlib

    from training.quickstart.run import main

    flags = ["--train-tasks", "4", "--eval-tasks", "2", "--warmup-tasks", "2", "--warmup-epochs", "1",
             "--warmup-tries", "3", "--warmup-separation", separation, "--warmup-only", "logging.wandb=disabled"]
    runs = {}
    for mode in ("parallel", "no-parallel"):
        assert main(["--out", str(tmp_path / mode), f"--{mode}-warmup", *flags]) == 0
        folder = tmp_path / mode
        runs[mode] = {"tries": json.loads((folder / "warmup.json").read_text())["warmup_tries"],
                      "weights": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                  for name in ("policy-init", "policy-warm") for p in (folder / name).glob("*.safetensors")},
                      "folders": sorted(p.name for p in folder.glob("policy-*"))}
    assert runs["parallel"] == runs["no-parallel"]
    assert len(runs["parallel"]["tries"]) == tried and runs["parallel"]["weights"]
    assert runs["parallel"]["folders"] == ["policy-init", "policy-warm"]
    assert not list((tmp_path / "no-parallel").glob("*.log"))
    if tried == 3:      # try 2 ran beside try 1 (where try 1 passes first, try 2 may be stopped before its log opens)
        assert (tmp_path / "parallel" / "warmup-try2.log").exists()


def test_cpu_flags_are_the_kernel_flags_of_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_tile avx512_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 avx512_vnni\n")
    assert cpu_flags(str(info)) == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]    # KERNEL_FLAGS' order
    assert cpu_flags(str(tmp_path / "missing")) == []


def test_experts_run_alone_and_without_a_busy_machine_timeout():
    """A seed makes the in-process gateway run the job unbatched (transformers_backend: seeded
    jobs get a group of their own), so a greedy reply cannot depend on its batch-mates."""
    from orchestrator.gateway.backends.transformers_backend import SUPPORTED_EXTRA
    from training.quickstart.env import EXPERT_TIMEOUT_S, UnbatchedExpert

    got = []
    expert = UnbatchedExpert(lambda model, messages, **kw: got.append(kw) or "reply")
    assert expert("m", [], temperature=0, max_tokens=8) == "reply"
    assert got == [{"seed": 0, "timeout": EXPERT_TIMEOUT_S, "temperature": 0, "max_tokens": 8}]
    assert "seed" in SUPPORTED_EXTRA


def test_tool_spread_moves_that_share_of_the_tool_decision_to_the_other_allowed_tools():
    """The starting policy routes imperfectly: at the first decision (the tool name) the warm-up
    target keeps 1 - spread on the demonstrated tool and splits spread over the tools the
    constraint allows there; later decisions (the alias) are untouched."""
    from training.quickstart.warmup import with_tool_spread

    choices = [[1, 7, 20, 0], [1, 7, 21, 0], [1, 8, 30, 0], [1, 9, 40, 0]]   # tools 7 / 8 / 9, tool 7: 2 aliases
    targets = {1: {7: 1.0}, 2: {20: 0.5, 21: 0.5}}
    got = with_tool_spread(targets, [1, 7, 20, 0], choices, spread=0.3)
    assert got[1] == pytest.approx({7: 0.7, 8: 0.15, 9: 0.15})
    assert got[2] == {20: 0.5, 21: 0.5}
    assert with_tool_spread({1: {7: 1.0}}, [1, 7, 20, 0], choices, spread=0.0) == {1: {7: 1.0}}
    # `to`: only the tools of those calls get the spread (the other evidence tool, not answer)
    only = with_tool_spread({1: {7: 1.0}, 2: {20: 0.5, 21: 0.5}}, [1, 7, 20, 0], choices, spread=0.3, to=[[1, 8, 30, 0]])
    assert only[1] == pytest.approx({7: 0.7, 8: 0.3})


def test_prior_reads_the_shared_prefix_once_with_the_logits_of_whole_rows(tmp_path):
    """next_token_logits (the warm-up's prompted alias prior) reads each shared prefix once and
    reuses its key/value cache; each row's logits equal a forward pass over the whole row."""
    import torch
    from _train_world import build_policy
    from transformers import AutoModelForCausalLM

    from training.quickstart.warmup import next_token_logits

    model = AutoModelForCausalLM.from_pretrained(build_policy(tmp_path / "policy")).eval()
    # a prefix tree: all share 4 ids, two of them 5; one row ends inside another; one repeats
    rows = [[5, 9, 11, 40, 41, 7], [5, 9, 11, 40, 52], [5, 9, 11, 40, 41, 8, 13], [5, 9, 11, 40, 41],
            [5, 9, 11, 40, 41, 8, 13], [5, 9]]
    for row, got in zip(rows, next_token_logits(model, rows)):
        with torch.inference_mode():
            whole = model(input_ids=torch.tensor([row])).logits[0, -1]
        assert torch.allclose(got, whole, atol=1e-5), row
    unrelated = [[3, 4], [6, 7, 8]]                                                  # no common prefix
    with torch.inference_mode():
        expected = [model(input_ids=torch.tensor([r])).logits[0, -1] for r in unrelated]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(next_token_logits(model, unrelated), expected))



def test_each_demonstrated_turn_gets_its_own_prompted_alias_choice_mixed_with_uniform():
    """`--alias-prior per-turn`: per turn, the prompted model's alias choice there (it differs
    with the preference line), floor-mixed with uniform; turns without an alias choice untouched.
    `pooled` (the default) gives every turn of a tool the same distribution, mixed the same way."""
    from training.quickstart.warmup import Demonstration, with_alias_prior, with_own_alias_choices

    def demo(preset):     # tool token 5, then an alias decision between tokens 7 and 8 at position 2
        return Demonstration([1, 2], [5, 6, 7, 0], {0: {5: 1.0}, 2: {7: 0.5, 8: 0.5}}, "search", preset)

    favour, cost, answer = demo("favour"), demo("cost"), Demonstration([1], [9, 0], {0: {9: 1.0}}, "answer")
    with_own_alias_choices([favour, cost, answer], [{7: 0.2, 8: 0.8}, {7: 0.9, 8: 0.1}, {}], floor=0.5)
    assert favour.targets[2] == pytest.approx({7: 0.35, 8: 0.65})      # 0.5 * 0.2 + 0.5 / 2
    assert cost.targets[2] == pytest.approx({7: 0.70, 8: 0.30})
    assert favour.targets[0] == {5: 1.0} and answer.targets == {0: {9: 1.0}}
    pooled = with_alias_prior([demo("favour"), demo("cost")], {"search": {7: 0.6, 8: 0.4}}, floor=0.5)
    assert [d.targets[2] for d in pooled] == [pytest.approx({7: 0.55, 8: 0.45})] * 2   # 0.5 * 0.6 + 0.25
    # --search-alias-floor: the search tool's own floor, the others keep --alias-floor
    other = Demonstration([1, 2], [5, 6, 7, 0], {0: {5: 1.0}, 2: {7: 0.5, 8: 0.5}}, "answer", "cost")
    mixed = with_alias_prior([demo("cost"), other], {"search": {7: 0.6, 8: 0.4}, "answer": {7: 1.0, 8: 0.0}},
                             floor=0.5, floors={"search": 0.8})
    assert mixed[0].targets[2] == pytest.approx({7: 0.52, 8: 0.48})     # 0.2 * 0.6 + 0.8 / 2
    assert mixed[1].targets[2] == pytest.approx({7: 0.75, 8: 0.25})     # 0.5 * 1.0 + 0.5 / 2


def test_favoured_share_is_its_share_of_its_own_tools_calls_and_of_all_calls():
    from training.quickstart.run import favoured_shares

    assert FAVOURED_ALIAS in TOOL_ALIASES["answer"]
    rollouts = [SimpleNamespace(tool_calls=calls) for calls in (
        {"search-2": 1, FAVOURED_ALIAS: 1},                  # 1 of 1 answers favoured
        {"search-1": 1, "answer-math-2": 1},                 # 0 of 1
        {"reasoner-1": 1, FAVOURED_ALIAS: 1, "answer-math-2": 1},   # two answers, one favoured
        {"reasoner-2": 2})]                                   # no answer call
    got = favoured_shares(rollouts)
    assert got["favoured_share"] == pytest.approx(2 / 4)              # answer calls: 2 of 4
    assert got["favoured_share_of_calls"] == pytest.approx(2 / 9)     # all calls: 2 + 2 + 3 + 2


def test_validation_lines_share_no_word_with_the_held_out_paraphrases_and_are_no_training_wording():
    from training.quickstart.env import VALIDATION_LINES

    def words(line):
        return {w.strip(".;,").lower() for w in line.format(alias=FAVOURED_ALIAS).split()} - {"preference:", FAVOURED_ALIAS}

    paraphrase_words = set().union(*(words(p) for p in PARAPHRASES.values()))
    assert set(VALIDATION_LINES) == set(PARAPHRASES) == set(WORDINGS)
    for preset, line in VALIDATION_LINES.items():
        assert not words(line) & paraphrase_words, line
        assert preference_words(preset, "validation") == line.format(alias=FAVOURED_ALIAS)
        assert line not in WORDINGS[preset] and ("{alias}" in line) == (preset == "favour")


def test_demonstrated_tasks_under_every_preset_differ_only_in_the_preference_line(world):
    from training.quickstart.warm_start import demonstrated_tasks

    paths, _ = world
    tasks = load_tasks([str(paths["warmup"])])
    assert demonstrated_tasks(tasks, "own") == tasks
    every = demonstrated_tasks(tasks, "all", seed=1)
    per_task = len(PRESETS) - 1 + len(FAVOUR_TRAIN_ALIASES)        # favour once per alias training names
    assert len(every) == len(tasks) * per_task
    for k, task in enumerate(tasks):
        group = every[k * per_task:(k + 1) * per_task]
        assert [t.metadata["preference_name"] for t in group] == ["accuracy", "cost",
                                                                  *["favour"] * len(FAVOUR_TRAIN_ALIASES)]
        assert [t.metadata["favoured"] for t in group[2:]] == FAVOUR_TRAIN_ALIASES
        assert [t.preference for t in group] == [preference_vector(t.metadata["preference_name"], t.metadata["favoured"])
                                                 for t in group]
        plain = task.metadata["plain_question"]
        assert [t.question for t in group] == [
            f"{plain}\n{preference_words(t.metadata['preference_name'], t.metadata['wording'], t.metadata['favoured'])}"
            for t in group]
        assert {(t.id, t.answer) for t in group} == {(task.id, task.answer)}
    assert len({t.metadata["wording"] for t in every}) > 1          # the wordings vary
    with pytest.raises(ValueError, match="--demo-presets"):
        demonstrated_tasks(tasks, "some")


def test_favour_boost_moves_the_answer_alias_target_onto_the_named_alias():
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from orchestrator.toolcall import format_tool_call
    from training.rollouts import choice_token_ids
    from training.quickstart.warmup import Demonstration, _alias_positions, with_favoured_boost

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    calls = choice_token_ids(tok, [format_tool_call("answer", {"model": a}) for a in ANSWER_ALIASES])
    pos = next(i for i in range(len(calls[0])) if len({c[i] for c in calls}) > 1)
    tokens = [c[pos] for c in calls]

    def demo(favoured, tool="answer"):
        return Demonstration([1], calls[0], {0: {calls[0][0]: 1.0}, pos: {t: 1 / 3 for t in tokens}}, tool,
                             "favour" if favoured else "cost", favoured)

    named, other, plain = demo("answer-math-2"), demo("answer-1", tool="search"), demo(None)
    assert _alias_positions(named) == [pos]
    boosted = with_favoured_boost([named, other, plain], tok, 0.5)
    want = {t: 1 / 6 + (0.5 if a == "answer-math-2" else 0) for t, a in zip(tokens, ANSWER_ALIASES)}
    assert boosted[0].targets[pos] == pytest.approx(want)
    assert boosted[1].targets[pos] == boosted[2].targets[pos] == {t: 1 / 3 for t in tokens}
    # the input is left as it was: a retry boosts the same demonstrations by 0.8, not 0.8 on top of 0.5
    assert named.targets[pos] == {t: 1 / 3 for t in tokens}
    again = with_favoured_boost([named], tok, 0.8)[0].targets[pos]
    assert again == pytest.approx({t: 0.2 / 3 + (0.8 if a == "answer-math-2" else 0) for t, a in zip(tokens, ANSWER_ALIASES)})


def test_warmup_loss_reads_the_shared_prefix_once_with_the_whole_rows_loss_and_gradients(tmp_path):
    """decision_loss runs the batch's common prefix (the system prompt) once and repeats its
    key/value cache over the rows: loss and gradients equal those of the whole rows, on a
    sliding-window policy whose window is shorter than the rows' own parts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from training.quickstart.warmup import Demonstration, decision_loss
    from training.tiny_policy import build_tiny_policy

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2, heads=2, seed=5, local_window=6)).eval()
    prefix = list(range(100, 130))
    demos = [Demonstration(prefix + [200 + i] * (5 + 3 * i), [7, 8 + i, 9, 0], {1: {8: 0.5, 8 + i: 0.5}, 2: {9: 1.0}},
                           "search") for i in range(4)]
    results = []
    for share in (False, True):
        model.zero_grad()
        loss = decision_loss(model, demos, tok.pad_token_id, share_prefix=share)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    (whole, whole_grads), (shared, shared_grads) = results
    assert shared == pytest.approx(whole, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(whole_grads, shared_grads))


def test_warmup_loss_weighs_the_alias_decisions(tmp_path):
    """alias_weight w: the loss is (sum of the tool decisions' cross-entropies + w x the alias
    decisions') / (their count + w x the alias count), checked against a whole-row forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from training.quickstart.warmup import Demonstration, decision_loss
    from training.tiny_policy import build_tiny_policy

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    model = AutoModelForCausalLM.from_pretrained(build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2,
                                                                   heads=2, seed=1)).eval()
    # position 1: the tool decision (first), position 2: the alias decision (two options)
    demos = [Demonstration([50, 51, 52 + i], [7, 8, 9 + i, 0], {1: {8: 1.0}, 2: {9: 0.25, 10: 0.75}}, "answer")
             for i in range(2)]
    tool_ce, alias_ce = [], []
    with torch.no_grad():
        for d in demos:
            logp = model(input_ids=torch.tensor([d.prompt_ids + d.response_ids])).logits[0].log_softmax(-1)
            at = lambda pos: logp[len(d.prompt_ids) + pos - 1]                  # noqa: E731
            tool_ce.append(-at(1)[8].item())
            alias_ce.append(-(0.25 * at(2)[9] + 0.75 * at(2)[10]).item())
        plain = decision_loss(model, demos, tok.pad_token_id, share_prefix=False).item()
        weighted = decision_loss(model, demos, tok.pad_token_id, alias_weight=3.0).item()
    assert plain == pytest.approx((sum(tool_ce) + sum(alias_ce)) / 4, rel=1e-5)
    assert weighted == pytest.approx((sum(tool_ce) + 3 * sum(alias_ce)) / (2 + 3 * 2), rel=1e-5)
    # favour_weight: only the answer alias decision of a turn whose line names an alias (demo 1)
    demos[1].favoured, demos[1].preset = "answer-4", "favour"
    with torch.no_grad():
        favour = decision_loss(model, demos, tok.pad_token_id, alias_weight=3.0, favour_weight=10.0).item()
    assert favour == pytest.approx((sum(tool_ce) + 3 * alias_ce[0] + 10 * alias_ce[1]) / (2 + 3 + 10), rel=1e-5)


@pytest.mark.parametrize("flags, message", [
    (["--alias-weight", "0"], "--alias-weight 0.0: a loss weight"),
    (["--alias-weight", "-1"], "--alias-weight -1.0: a loss weight"),
    (["--favour-weight", "0"], "--favour-weight 0.0: a loss weight"),
    (["--favour-aliases", "answer-1"], "--favour-aliases answer-1: each one of answer-1, answer-4, answer-math-2, and answer-4"),
    (["--favour-aliases", "answer-4,answer-9"], "--favour-aliases answer-4,answer-9: each one of"),
    (["--seeds", "x"], "argument --seeds: 'x': expected a count of seeds (3) or a comma-separated list"),
    (["--seeds", "0"], "argument --seeds: '0': a count of seeds must be at least 1"),
    (["--seeds", "0,1,1"], "argument --seeds: '0,1,1': seed 1 is listed more than once"),
    (["--seeds", "1,-2"], "argument --seeds: '1,-2': expected a count"),
    (["--eval-tasks", "0"], "--eval-tasks 0: must be at least 1"),
    (["--favour-boost", "2"], "--favour-boost 2.0: a share"),
    (["--warmup-tries", "0"], "--warmup-tries 0: the number of warm-ups to try, must be >= 1"),
    (["--warmup-separation", "1.5"], "--warmup-separation 1.5: a difference of probabilities"),
    (["--retry-favour-boost", "-0.1"], "--retry-favour-boost -0.1: a share"),
    (["--alias-floor", "1.5"], "--alias-floor 1.5: a share"),
    (["--search-alias-floor", "-0.2"], "--search-alias-floor -0.2: a share"),
    (["--warmup-lr", "0"], "--warmup-lr 0.0: a learning rate, must be > 0"),
    (["--policy", "smollm2", "--warmup-epochs", "0"], "--warmup-epochs 0: must be at least 1"),
    (["--policy", "smollm2", "--embeddings", "smollm2"], "--embeddings smollm2: starts the tiny policy's table"),
    (["--unread-words", "-1"], "--unread-words -1: words per preference line, must be >= 0"),
    (["--global-layers", "2"], "--global-layers 2: 0 .. --layers - 1 (1)"),
    (["--global-layers", "-1"], "--global-layers -1: 0 .. --layers - 1"),
    (["--global-layers", "-1", "--local-window", "0"], "--global-layers -1: 0 .. --layers - 1"),
    (["--local-window", "-4"], "--local-window -4: tokens a local layer attends to, must be >= 0"),
    (["--layers", "0"], "--layers 0: must be at least 1"),
    (["--hidden", "0"], "--hidden 0: must be at least 1"),
    (["--policy", "smollm2", "--unread-words", "3"], "--unread-words 3: the tiny policy's warm-up only")])
def test_bad_flags_get_one_line_naming_the_flag(flags, message, capsys):
    from training.quickstart.cli import _args

    with pytest.raises(SystemExit) as exit_:
        _args(flags)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1


def test_each_policy_gets_its_own_learning_rates_kl_weight_and_steps_unless_the_command_line_sets_them():
    from training.quickstart.cli import _args

    tiny = _args(["x=1"])
    assert (tiny.warmup_epochs, tiny.warmup_lr, tiny.overrides) == (24, 5e-3, ["x=1"])   # GRPO's: the YAML's
    pre = _args(["--policy", "smollm2", "x=1"])
    assert (pre.warmup_epochs, pre.warmup_lr) == (4, 1e-4)
    assert pre.overrides == ["optim.lr=2e-05", "algorithm.kl_coef=0.0001", "trainer.total_steps=12", "x=1"]
    mine = _args(["--policy", "smollm2", "--warmup-epochs", "2", "--warmup-lr", "3e-4", "optim.lr=1e-6",
                  "algorithm.kl_coef=0.5", "trainer.total_steps=3"])
    assert (mine.warmup_epochs, mine.warmup_lr, mine.overrides) == (2, 3e-4, ["optim.lr=1e-6", "algorithm.kl_coef=0.5",
                                                                             "trainer.total_steps=3"])
    partial = _args(["--policy", "smollm2", "algorithm.kl_coef=0"])
    assert partial.overrides == ["optim.lr=2e-05", "trainer.total_steps=12", "algorithm.kl_coef=0"]


@pytest.mark.parametrize("flags, seeds", [([], [0]), (["--seeds", "3"], [0, 1, 2]), (["--seed", "3"], [3]),
                                          (["--seed", "2", "--seeds", "2"], [2, 3]), (["--seeds", "4,0,2"], [4, 0, 2])])
def test_seeds_are_a_count_from_seed_or_a_list(flags, seeds):
    from training.quickstart.cli import _args, seeds_to_run

    assert seeds_to_run(_args(flags)) == seeds


def test_every_preference_line_has_a_token_found_nowhere_else_in_the_policys_context(world):
    """The policy tells the presets apart only by their lines' tokens.  "Preference: accuracy
    only." had one token of its own, " only", and it ends every arithmetic question ("Answer
    with the number only."), so on half the tasks the accuracy line looked like the question
    (docs/history.md, seventh round).  Each accuracy and cost line must keep a token that occurs
    in no other line, no question of any split and no part of the orchestrator's prompt; a favour
    line is told apart by the alias it names (only favour lines name one): some share every other
    word with an accuracy or cost line on purpose, so that the alias is what sets them apart."""
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path

    paths, catalog = world
    tok = AutoTokenizer.from_pretrained(smollm2_path())
    ids = lambda text: set(tok.encode(text, add_special_tokens=False))   # noqa: E731
    elsewhere = set()
    for split in ("train", "eval", "warmup"):
        for task in load_tasks([str(paths[split])]):
            elsewhere |= ids(task.metadata["plain_question"])
    prompts = Prompts.load(PROMPTS_DIR)                  # the policy's own two messages (experts' prompts aside)
    elsewhere |= ids(prompts.render("system")) | ids(prompts.render("user", question="", documents="", code="",
                                                                    evidence=""))
    elsewhere |= ids(json.dumps(catalog.model_dump()))
    lines = {name: [preference_words(name, k, a) for k in range(len(WORDINGS[name])) for a in ANSWER_ALIASES]
             for name in WORDINGS}
    for name, words in lines.items():
        if name == "favour":
            continue
        others = set().union(*(ids(w) for n, ws in lines.items() if n != name for w in ws))
        for line in words:
            own = ids(line) - others - elsewhere
            assert own, f"preset {name!r}: every token of {line!r} also occurs elsewhere in the context"
    # a favour line names its alias, and no other line names any answer alias
    for name, words in lines.items():
        for line in words:
            named = {a for a in ANSWER_ALIASES if a in line}
            assert named == (set() if name != "favour" else named) and (name != "favour" or len(named) == 1)


def test_the_world_models_come_from_configs_and_an_unpriced_one_is_named(tmp_path):
    from training.quickstart.env import TASK_MODELS, UNSEEN_TOOLS, WORLD_FILE, load_world_models

    assert load_world_models(WORLD_FILE) == (TASK_MODELS, UNSEEN_TOOLS)
    bad = tmp_path / "world.yaml"
    bad.write_text("task_models: {answer-4: gpt-7}\nunseen_tools: {}\n")
    with pytest.raises(ValueError, match=r"world\.yaml: model 'gpt-7' has no price in tools\.json"):
        load_world_models(bad)
    bad.write_text("task_models: {}\n")
    with pytest.raises(ValueError, match="exactly the keys task_models and unseen_tools"):
        load_world_models(bad)


def test_reading_is_the_favoured_alias_probability_at_the_answer_decision(world, tmp_path):
    """favour_reading: for each line, the mean over tasks of the policy's probability of answer-4
    among the answer aliases at the answer turn's alias decision, equal to a whole-row forward pass;
    the lines name answer-4 (training words, paraphrase), the other training alias, or none."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from training.quickstart.reading import OTHER_ALIAS, favour_reading, reading_lines
    from training.quickstart.warmup import _alias_positions, demonstrations
    from training.tiny_policy import build_tiny_policy

    paths, catalog = world
    tasks = load_tasks([str(paths["eval"])])[:2]
    lines = reading_lines(tasks)
    assert [t.metadata["favoured"] for t in lines["favour_other_alias"]] == [OTHER_ALIAS] * 2 != [FAVOURED_ALIAS] * 2
    assert all(PARAPHRASES["favour"].format(alias=FAVOURED_ALIAS) in t.question for t in lines["favour_paraphrase"])
    assert all("answer-" not in t.question for t in lines["cost"] + lines["accuracy"])
    runtime = SimpleNamespace(catalog=catalog, retriever=_Retriever(paths["corpus"]), prompts=Prompts.load(PROMPTS_DIR))
    budgets = Budgets(context_tokens=2048)
    tok = AutoTokenizer.from_pretrained(smollm2_path())
    policy = build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2, heads=2, seed=3)
    reading = favour_reading(policy, tasks, runtime, budgets=budgets, topk=1)
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    four = tok(FAVOURED_ALIAS.split("-")[1], add_special_tokens=False)["input_ids"][0]
    for name, line_tasks in lines.items():
        demos = [d for d in demonstrations(line_tasks, tok, catalog, runtime.retriever, prompts=runtime.prompts,
                                           budgets=budgets, topk=1) if d.tool == "answer"]
        probs = []
        for d in demos:
            pos = _alias_positions(d)[0]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([d.prompt_ids + d.response_ids[:pos]])).logits[0, -1]
            options = sorted(d.targets[pos])
            assert four in options
            probs.append(logits[options].softmax(-1)[options.index(four)].item())
        assert len(probs) == 2 and reading[name] == pytest.approx(sum(probs) / len(probs), abs=2e-4)


@pytest.mark.parametrize("flags, tries", [
    ([], [(0, 0.5), (0, 0.65), (10_007, 0.65), (20_014, 0.65)]),
    (["--warmup-tries", "1"], [(0, 0.5)]),
    (["--warmup-tries", "4", "--favour-boost", "0.3", "--retry-favour-boost", "0.9"],
     [(0, 0.3), (0, 0.9), (10_007, 0.9), (20_014, 0.9)]),
    (["--policy", "smollm2"], [(0, 0.5)])])
def test_warmup_retries_teach_the_favoured_alias_harder_then_change_the_initialisation(flags, tries):
    """(seed offset, favour boost) per try: the run's own seed and boost first, then the same
    initialisation with the retry boost, then other initialisations; a pretrained policy once."""
    from training.quickstart.cli import _args
    from training.quickstart.warm_start import RETRY_SEED_STEP, warmup_tries

    assert RETRY_SEED_STEP == 10_007 and warmup_tries(_args(flags)) == tries


def test_separation_is_the_favour_lines_lift_over_the_larger_other_line():
    """P(favour) - max(P(cost), P(accuracy)): 0.56 - max(0.12, 0.31) = 0.25; negative where the
    favour line gives answer-4 less than another line does."""
    from training.quickstart.reading import separation

    assert separation({"favour": 0.56, "cost": 0.12, "accuracy": 0.31, "favour_paraphrase": 0.9}) == 0.25
    assert separation({"favour": 0.2, "cost": 0.45, "accuracy": 0.1}) == -0.25


def test_a_cpu_run_hides_the_gpus_and_a_cuda_run_keeps_them():
    from training.quickstart.run import hide_gpus_for_a_cpu_run

    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    hide_gpus_for_a_cpu_run("cuda", env)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    hide_gpus_for_a_cpu_run("cpu", env)
    assert env == {"CUDA_VISIBLE_DEVICES": ""}


def _warm_up(out, demos, *, seed: int, warmup_validation: bool, embeddings: str = "random"):
    """warm_start.warm_up with three tries (boost 0.5, then 0.8) over `demos`, on stand-in config and runtime."""
    from training.quickstart import warm_start

    cfg = SimpleNamespace(run=SimpleNamespace(seed=seed, device="cpu"), rollout=SimpleNamespace(context_tokens=2048))
    runtime = SimpleNamespace(qa=SimpleNamespace(retrieval=SimpleNamespace(topk=1)))
    args = SimpleNamespace(policy="tiny", warmup_tries=3, favour_boost=0.5, retry_favour_boost=0.8, hidden=8, layers=1,
                           global_layers=1, local_window=0, warmup_epochs=1, warmup_lr=1e-3, warmup_batch=2, alias_weight=1.0,
                           favour_weight=1.0, warmup_separation=0.25, alias_prior="pooled", tool_spread=0.3,
                           warmup_validation=warmup_validation, embeddings=embeddings, unread_words=0,
                           parallel_warmup=True)     # no indexes: in turn all the same
    return warm_start.warm_up(out, cfg, runtime, demos, [], None, args)


def test_each_warm_up_try_is_taught_the_demonstrations_boosted_by_its_own_favour_boost(monkeypatch, tmp_path):
    """warm_start.warm_up: try k trains on with_favoured_boost(demos, boost of try k), from the original
    demonstrations each time, and stops at the first try whose reading separates the lines."""
    import training.quickstart.reading as reading
    import training.quickstart.warmup as warmup
    import training.tiny_policy as tiny_policy
    from training.quickstart import warm_start

    taught, inits, tables = [], [], []
    monkeypatch.setattr(tiny_policy, "projected_embeddings", lambda folder, hidden: ("table", hidden))
    monkeypatch.setattr(tiny_policy, "build_tiny_policy",
                        lambda out, tok, seed, embeddings, **kw: inits.append(seed) or tables.append(embeddings) or out)
    monkeypatch.setattr(warmup, "with_favoured_boost", lambda demos, tok, boost: [(boost, d) for d in demos])
    def supervised_warmup(init, out, demos, **kw):
        taught.append(demos)
        out.mkdir()
        (out / "weights").write_text(str(len(taught)))
        return out

    monkeypatch.setattr(warmup, "supervised_warmup", supervised_warmup)
    readings = iter([{"favour": 0.45, "cost": 0.45, "accuracy": 0.44},      # reads no line
                     {"favour": 0.52, "cost": 0.40, "accuracy": 0.31},      # separation 0.12 < 0.25
                     {"favour": 0.84, "cost": 0.22, "accuracy": 0.21}])     # 0.62: kept
    monkeypatch.setattr(reading, "favour_reading", lambda *a, **k: next(readings))
    monkeypatch.setattr(warm_start, "taught_distribution", lambda demos, tok: {"demos": demos})
    demos = ["d1", "d2"]
    warm, result = _warm_up(tmp_path, demos, seed=7, warmup_validation=False, embeddings="smollm2")
    assert tables == [("table", 8)] * 3             # SmolLM2's table, projected once, starts every try
    assert taught == [[(0.5, "d1"), (0.5, "d2")], [(0.8, "d1"), (0.8, "d2")], [(0.8, "d1"), (0.8, "d2")]]
    assert inits == [7, 7, 7 + warm_start.RETRY_SEED_STEP]
    assert [t["favour_boost"] for t in result["tries"]] == [0.5, 0.8, 0.8]
    assert [t["kept"] for t in result["tries"]] == [False, False, True]
    assert result["taught"] == {"demos": taught[-1]}          # the kept try's distribution is reported
    assert demos == ["d1", "d2"]
    assert warm == tmp_path / "policy-warm" and (warm / "weights").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy-warm"]      # the other tries' models removed


def test_where_no_warm_up_try_separates_the_best_one_is_kept(monkeypatch, tmp_path):
    """Separation is the smaller lift of the training words and the validation lines: a start that
    reads the training words (0.45 over cost) but sends unfamiliar lines anywhere (0.02) does not pass."""
    import training.quickstart.reading as reading
    import training.quickstart.warmup as warmup
    import training.tiny_policy as tiny_policy
    from training.quickstart import warm_start
    from training.quickstart.reading import separation

    def line(f, c, a, fv, cv, av):
        return {"favour": f, "cost": c, "accuracy": a, "favour_validation": fv, "cost_validation": cv,
                "accuracy_validation": av}

    readings = [line(0.60, 0.15, 0.15, 0.50, 0.48, 0.45), line(0.55, 0.20, 0.10, 0.45, 0.25, 0.20),
                line(0.40, 0.38, 0.38, 0.40, 0.40, 0.40)]
    assert [separation(r, validation=True) for r in readings] == [0.02, 0.2, 0.0]
    assert separation({"favour": 0.6, "cost": 0.1, "accuracy": 0.2}, validation=True) == 0.4   # none to read
    assert separation(readings[0]) == 0.45                                         # training words alone
    made = iter(range(1, 4))

    def supervised_warmup(init, out, demos, **kw):
        out.mkdir()
        (out / "weights").write_text(str(next(made)))
        return out

    monkeypatch.setattr(tiny_policy, "build_tiny_policy", lambda out, tok, seed, **kw: out)
    monkeypatch.setattr(warmup, "with_favoured_boost", lambda demos, tok, boost: demos)
    monkeypatch.setattr(warmup, "supervised_warmup", supervised_warmup)
    monkeypatch.setattr(reading, "favour_reading", lambda *a, lines, **k: readings.pop(0) if set(lines) == set(warm_start.PROBE_LINES) else None)
    monkeypatch.setattr(warm_start, "taught_distribution", lambda demos, tok: {})
    warm, result = _warm_up(tmp_path, ["d"], seed=0, warmup_validation=True)
    assert [t["separation"] for t in result["tries"]] == [0.02, 0.2, 0.0]
    assert [t["kept"] for t in result["tries"]] == [False, True, False]
    assert (warm / "weights").read_text() == "2"
