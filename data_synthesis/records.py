"""The training record: one example the trainer and evaluator read (the ONE definition).

Every example carries what the policy must read rather than memorise: its tool subset
with alias -> model mapping, the prices of those models, and a preference vector, each
also written into `instruction` in words.  Field-by-field documentation:
docs/data_synthesis.md#training-records.

On disk (parquet and JSONL, written with HF `datasets`) the mapping-valued fields
(`tools`, `prices`, `latency_s`, `preference`, `tau2_task`) are JSON strings, because
Arrow needs one type per column and these have per-example keys; `from_row` decodes.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RESERVED_PREFERENCE_KEYS = ("outcome", "cost", "latency")
JSON_FIELDS = ("tools", "prices", "latency_s", "preference", "tau2_task")
Difficulty = Literal["easy", "medium", "hard", "unrated"]


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: float = Field(ge=0, description="$ per 1M prompt tokens")
    output: float = Field(ge=0, description="$ per 1M completion tokens")


class TrainingExample(BaseModel):
    """One training example (QA question or tau2 task) with its randomised tool setting."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    kind: Literal["qa", "tau2"]
    domain: str                                   # "frames", "school", "bank", ...
    difficulty: Difficulty = "unrated"
    question: str                                 # the raw problem (tau2: the user's reason for calling)
    instruction: str                              # what the policy reads: question + tools/prices + preference
    answer: str | None = None                     # QA reference answer
    tau2_task: dict[str, Any] | None = None       # the tau2 Task (kind "tau2")
    domain_dir: str | None = None                 # tau2 domain folder (db.json, tools.py, policy.md)
    tools: dict[str, dict[str, str]]              # tool -> {alias: model}
    prices: dict[str, Price]                      # model -> $/1M tokens, perturbed per example
    latency_s: dict[str, float]                   # alias -> listed mean latency, seconds
    preference: dict[str, float]                  # alias | "outcome" | "cost" | "latency" -> weight
    preference_name: str                          # "cheapest", "fastest", "avoid_tool:search", ...
    preference_text: str                          # the preference as written in `instruction`
    seed: int                                     # seed of this example's randomisation
    source: str = ""                              # where the question/task came from

    @model_validator(mode="after")
    def _consistent(self) -> "TrainingExample":
        aliases = {a: m for per_tool in self.tools.values() for a, m in per_tool.items()}
        if self.kind == "qa" and self.answer is None:
            raise ValueError(f"example {self.id}: a qa example needs an answer")
        if self.kind == "tau2" and not self.tau2_task:
            raise ValueError(f"example {self.id}: a tau2 example needs tau2_task")
        missing = sorted({m for m in aliases.values()} - set(self.prices))
        if missing:
            raise ValueError(f"example {self.id}: prices lack models {missing}")
        if set(self.latency_s) != set(aliases):
            raise ValueError(f"example {self.id}: latency_s keys must be exactly the aliases")
        clash = sorted(set(aliases) & set(RESERVED_PREFERENCE_KEYS))
        unknown = sorted(k for k in self.preference if k not in aliases and k not in RESERVED_PREFERENCE_KEYS)
        if clash or unknown:
            raise ValueError(f"example {self.id}: preference keys must be aliases or {RESERVED_PREFERENCE_KEYS}; "
                             f"bad: {clash or unknown}")
        return self

    @property
    def aliases(self) -> dict[str, str]:
        """alias -> model over every tool of this example."""
        return {a: m for per_tool in self.tools.values() for a, m in per_tool.items()}

    def loop_task_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `orchestrator.loop.Task` (question = the full instruction)."""
        return {"id": self.id, "question": self.instruction, "answer": self.answer, "kind": self.kind,
                "tools": self.tools, "prices": {m: p.model_dump() for m, p in self.prices.items()},
                "preference": dict(self.preference),
                "metadata": {"domain": self.domain, "difficulty": self.difficulty, "latency_s": self.latency_s,
                             "tau2_task": self.tau2_task, "domain_dir": self.domain_dir,
                             "preference_name": self.preference_name}}

    def to_row(self) -> dict[str, Any]:
        """A flat row for Arrow: mapping-valued fields as JSON text (sorted keys)."""
        row = self.model_dump(mode="json")
        for name in JSON_FIELDS:
            row[name] = json.dumps(row[name], sort_keys=True, ensure_ascii=False)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "TrainingExample":
        """Read a row from parquet/JSONL (JSON-text fields decoded) or a plain dict."""
        data = dict(row)
        for name in JSON_FIELDS:
            if isinstance(data.get(name), str):
                data[name] = json.loads(data[name])
        return cls.model_validate(data)


def load_examples(path: str) -> list[TrainingExample]:
    """Read a dataset file written by `data_synthesis.dataset` (.parquet or .jsonl)."""
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq  # lazy: heavy; only for .parquet files
        rows = pq.read_table(path).to_pylist()
    else:
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    return [TrainingExample.from_row(r) for r in rows]
