"""A function-calling training world: the shipped `school` schema through the offline pipeline,
FRAMES-style "What is N + N?" questions, one mixed training file, scripted experts.

    root/school/          python -m data_synthesis.synthesize --domain-dir school --out root/school
    root/qa.jsonl         {"id", "question", "answer"} rows
    root/data/train.*     python -m data_synthesis.dataset --tau2 root/school --qa root/qa.jsonl --out root/data

Experts (`scripted_llm`): QA tools as in _train_world (code then answer is right); for
`call_expert`, gpt-5 and gpt-5-mini propose the task's next gold action not yet executed in
the conversation, then `done` with the information to communicate; every other model
proposes `done` at once ("I cannot help").  So a rollout that keeps calling a strong
expert solves its task and one that calls a weak one fails: rewards vary within a group.
"""
from __future__ import annotations

import json
from pathlib import Path

from _train_world import _llm as qa_llm
from _train_world import _run_code

from orchestrator.catalog import load_catalog
from orchestrator.records import LLMResponse, ToolCall, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import load_profile
from orchestrator.setup import build_runtime

STRONG = ("gpt-5", "gpt-5-mini")


def build_world(root: Path, num_tasks: int = 6, num_qa: int = 4) -> dict[str, Path]:
    from data_synthesis.dataset import main as dataset_main
    from data_synthesis.synthesize import main as synthesize_main

    school, data = root / "school", root / "data"
    assert synthesize_main(["--domain-dir", "school", "--out", str(school), "--num-tasks", str(num_tasks),
                            "--seed", "0", "--no-dataset"]) == 0
    qa = root / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                          for i in range(1, num_qa + 1)))
    assert dataset_main(["--tau2", str(school), "--qa", str(qa), "--out", str(data), "--seed", "0"]) == 0
    return {"school": school, "qa": qa, "train": data / "train.parquet", "train_jsonl": data / "train.jsonl"}


def gold_of(tasks: list[dict], transcript: list[dict]) -> dict | None:
    """The tau2 task whose user request opens `transcript` (the episode's first user message)."""
    from data_synthesis.tasks import instructions_text

    request = transcript[1]["content"]
    return next((t for t in tasks if instructions_text(t) in request), None)


def executed(action: dict, transcript: list[dict]) -> bool:
    """Whether the conversation shows `action` run: as the policy's own call or an expert's."""
    call = json.dumps({"name": action["name"], "arguments": action["arguments"]})
    by_expert = f"called {action['name']}({json.dumps(action['arguments'])})]"
    return any(call in m["content"] or by_expert in m["content"] for m in transcript[2:])


def scripted_llm(tasks: list[dict]):
    qa = qa_llm(0.0)

    def llm(model, messages, **kw):
        if not kw.get("tools"):
            return qa(model, messages, **kw)
        task = gold_of(tasks, messages)
        if model not in STRONG or task is None:
            call = ToolCall("done", {"message": "I cannot help with that."})
        else:
            crit = task["evaluation_criteria"]
            todo = [a for a in crit["actions"] if not executed(a, messages)]
            call = (ToolCall(todo[0]["name"], todo[0]["arguments"]) if todo else
                    ToolCall("done", {"message": "Done. " + ", ".join(crit.get("communicate_info") or [])}))
        return LLMResponse(model=model, text="", tool_calls=[call], usage=Usage(300, 20))
    return llm


def scripted_runtime(school: Path) -> ToolRuntime:
    """Training's runtime (the default profile's qa.train and tau2.train sections) with the scripted experts."""
    tasks = json.loads((school / "tasks.json").read_text())
    profile = load_profile("default")
    sections = {"qa": profile.section("qa", "train"), "tau2": profile.section("tau2", "train")}
    return build_runtime(profile, sections, load_catalog(), llm=scripted_llm(tasks), run_code=_run_code)


def policy_texts(school: Path) -> list[str]:
    """Texts a tiny tokenizer for this world is trained on (what its prompts contain)."""
    from orchestrator.domains.folder import load_domain
    from orchestrator.catalog import load_catalog as catalog
    from orchestrator.episodes.tau2_solo import episode_tools

    domain = load_domain(school)
    tools = episode_tools(domain, catalog())[0]
    prompts = Path(__file__).resolve().parents[1] / "orchestrator" / "prompts"
    texts = [json.dumps(tools)] * 3 + [domain.policy] * 3
    texts += [(prompts / f).read_text() * 3 for f in ("domain_system.txt", "domain_solo_user.txt")]
    return texts
