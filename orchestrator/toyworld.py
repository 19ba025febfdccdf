"""A small world the project builds itself: a fictional-people corpus and questions on it.

Two kinds of questions, so different tools are needed:
- lookup ("In which city was Mira Tallow born?"): answerable only from the corpus (search);
- arithmetic ("What is 37 * 41 + 12?"): answerable by running code (enhance_reasoning).

Everything is generated from a seed with Faker, so the corpus and tasks are the same on
every machine; nothing is downloaded and ../shared is not read.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from faker import Faker

from orchestrator.loop import Task

OCCUPATIONS = ["lighthouse keeper", "glassblower", "cartographer", "beekeeper", "clockmaker",
               "botanist", "ferry captain", "luthier", "astronomer", "bookbinder"]


@dataclass
class Person:
    id: str
    name: str
    city: str
    year: int
    occupation: str

    def passage(self) -> str:
        return (f"{self.name}\n{self.name} was born in {self.city} in {self.year}. "
                f"{self.name.split()[0]} worked as a {self.occupation} for most of their life.")


def build_people(n: int, seed: int) -> list[Person]:
    fake = Faker()
    fake.seed_instance(seed)
    names: set[str] = set()
    people = []
    while len(people) < n:
        name = f"{fake.first_name()} {fake.last_name()}"
        if name in names:
            continue
        names.add(name)
        people.append(Person(id=f"p{len(people):04d}", name=name, city=fake.city(),
                             year=fake.random_int(1800, 1990), occupation=fake.random_element(OCCUPATIONS)))
    return people


def build_tasks(people: list[Person], n_lookup: int, n_arith: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for p in rng.sample(people, n_lookup):
        kind = rng.choice(["city", "year"])
        q = (f"In which city was {p.name} born?" if kind == "city" else f"In which year was {p.name} born?")
        tasks.append(Task(id=f"lookup-{p.id}-{kind}", question=q, answer=p.city if kind == "city" else str(p.year),
                          metadata={"type": "lookup", "doc_id": p.id}))
    for i in range(n_arith):
        a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(2, 60)
        tasks.append(Task(id=f"arith-{i:03d}", question=f"What is {a} * {b} + {c}? Answer with the number only.",
                          answer=str(a * b + c), metadata={"type": "arithmetic"}))
    rng.shuffle(tasks)
    return tasks


def write_world(out: Path, n_people: int = 200, n_lookup: int = 6, n_arith: int = 6, seed: int = 0) -> tuple[Path, Path]:
    """Write `corpus.jsonl` ({"id", "contents"}) and `tasks.jsonl` under `out`; return both paths."""
    out.mkdir(parents=True, exist_ok=True)
    people = build_people(n_people, seed)
    corpus, tasks = out / "corpus.jsonl", out / "tasks.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.passage()}) + "\n" for p in people))
    tasks.write_text("".join(json.dumps(asdict(t)) + "\n" for t in build_tasks(people, n_lookup, n_arith, seed)))
    return corpus, tasks


def load_tasks(path: Path) -> list[Task]:
    return [Task(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
