"""A tiny, fast training world for the trainer tests: random tiny policy, scripted experts.

Tasks are "What is N + N?"; the code expert writes `print(N*2)`, the (fake) sandbox
evaluates it, and the answer expert answers correctly only when a code result is in its
context.  So a rollout is right exactly when it calls enhance_reasoning before answer,
and rewards vary within a group: what GRPO needs to produce a gradient.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

from orchestrator.catalog import load_catalog
from orchestrator.loop import Task, task_catalog
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import allowed_call_strings

TOOLS = {"enhance_reasoning": {"reasoner-3": "Qwen2.5-Coder-32B-Instruct"},
         "answer": {"answer-1": "gpt-5", "answer-4": "Qwen3-32B"}}


def write_tasks(path: Path, n: int = 4) -> Path:
    rows = [{"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i), "tools": TOOLS}
            for i in range(1, n + 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def build_policy(folder: Path, extra_texts: list[str] = (), max_positions: int = 4096, vocab_size: int = 1200) -> Path:
    """Tokenizer trained on the prompts it will see (short sequences), tiny Llama.
    `extra_texts`: more prompt text to train the tokenizer on (e.g. a domain's tools)."""
    from training.tiny_policy import build_tiny_policy, tiny_tokenizer

    catalog = task_catalog(load_catalog(), Task("x", "q", tools=TOOLS))
    texts = [json.dumps(catalog.openai_tools(tools=catalog.tools))] * 5
    texts += allowed_call_strings({t: list(a) for t, a in TOOLS.items()}) * 50
    texts += [(Path(__file__).resolve().parents[1] / "orchestrator/prompts" / f).read_text() * 5
              for f in ("system.txt", "user.txt")]
    texts += [f"What is {i} + {i}? Code results: Output: {2 * i}" for i in range(50)]
    return build_tiny_policy(folder, tiny_tokenizer(texts + list(extra_texts), vocab_size=vocab_size), hidden=32, layers=1,
                             heads=2, max_positions=max_positions)


def _llm(delay: float):
    def llm(model, messages, **kw):
        time.sleep(delay)
        prompt = messages[0]["content"]
        n = int(re.search(r"What is (\d+) \+", prompt).group(1))
        if "Python" in prompt:
            text = f"```python\nprint({n}*2)\n```"
        else:
            text = f"<answer>{2 * n if 'Output' in prompt else '?'}</answer>"
        return LLMResponse(model=model, text=text, usage=Usage(len(prompt) // 4, 10))
    return llm


def _run_code(code: str, timeout: float):
    a, b = re.search(r"print\((\d+)\*(\d+)\)", code).groups()
    return SimpleNamespace(stdout=f"{int(a) * int(b)}\n", stderr="", exit_code=0, timed_out=False, duration_s=0.5)


def fake_runtime(expert_delay: float = 0.0) -> ToolRuntime:
    return ToolRuntime(catalog=load_catalog(), llm=_llm(expert_delay), run_code=_run_code)


def overrides(root: Path, policy: Path, tasks: Path, **extra) -> list[str]:
    base = {"run.dir": str(root / "run"), "model.path": str(policy), "data.train_files": f"[{tasks}]",
            "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 4, "rollout.max_turns": 3,
            "rollout.max_tokens": 48, "rollout.constrained": "true", "rollout.concurrency": 4,
            "rollout.context_tokens": 4000, "trainer.total_steps": 2, "trainer.save_every": 1,
            "trainer.keep_checkpoints": 5, "logging.wandb": "disabled", "logging.console": "false",
            "optim.lr": "1e-3", "reward.judge": "exact", "algorithm.micro_batch_size": 4}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def logged_batches(run_dir: Path) -> dict[int, dict[str, int]]:
    """{step: {question: rollouts}} as rollouts.jsonl logged them (logging.rollouts_every: 1)."""
    out: dict[int, dict[str, int]] = {}
    for line in (Path(run_dir) / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = out.setdefault(row["step"], {})
        step[row["question"]] = step.get(row["question"], 0) + 1
    return out


def sampled_batches(cfg, steps: int) -> dict[int, dict[str, int]]:
    """{step: {question: rollouts}} each step should train: the task sampler's order from the start."""
    from training.tasks import TaskSampler, load_tasks

    tasks = load_tasks(cfg.data.train_files, cfg.data.default_preference)
    sampler = TaskSampler(len(tasks), cfg.run.seed, cfg.data.shuffle)
    return {k + 1: {tasks[i].question: cfg.rollout.rollouts_per_task for i in sampler.take(cfg.rollout.tasks_per_step)}
            for k in range(steps)}


def slow_on_one_task(seconds: float, question: str = "What is 1 + 1?", expert_delay: float = 0.0) -> ToolRuntime:
    """`fake_runtime`, its experts `seconds` slower on `question`: that task's group has a slow tail
    (asynchronous training's completion order)."""
    runtime = fake_runtime(expert_delay)
    inner = runtime.llm

    def llm(model, messages, **kw):
        if question in messages[0]["content"]:
            time.sleep(seconds)
        return inner(model, messages, **kw)
    runtime.llm = llm
    return runtime


def sampled_groups(cfg, steps: int) -> dict[tuple[int, int], str]:
    """{(batch, slot): question} the task sampler gives batches 0 .. steps - 1."""
    from training.tasks import TaskSampler, load_tasks

    tasks = load_tasks(cfg.data.train_files, cfg.data.default_preference)
    sampler = TaskSampler(len(tasks), cfg.run.seed, cfg.data.shuffle)
    return {(j, slot): tasks[i].question for j in range(steps)
            for slot, i in enumerate(sampler.take(cfg.rollout.tasks_per_step))}


def made_groups(rows: list[dict]) -> dict[tuple[int, int], tuple[str, int]]:
    """{(batch, slot): (question, rollouts)} as an asynchronous run's rollouts.jsonl rows logged the
    trained groups (`batch_step`, `slot`); one question per group."""
    out: dict[tuple[int, int], tuple[str, int]] = {}
    for r in rows:
        key = (r["batch_step"] - 1, r["slot"])
        question, n = out.get(key, (r["question"], 0))
        if question != r["question"]:
            raise AssertionError(f"group {key} logged two questions: {question!r} and {r['question']!r}")
        out[key] = (question, n + 1)
    return out


def sigterm_after_step_1(script: Path, root: Path, policy, tasks, timeout: float = 240.0):
    """Run `script root policy tasks` (a training job), SIGTERM it once step 1 is logged (step 2's
    rollouts run), wait for it; (return code, output)."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, str(script), str(root), str(policy), str(tasks)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = Path(root) / "run" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text().strip()):
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before step 1 was logged:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the job never finished step 1")
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output
