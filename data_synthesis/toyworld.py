"""A small world the project builds itself: a fictional-people corpus and questions on it.

Two kinds of questions, so different tools are needed:
- lookup ("In which city was Mira Tallow born?"): answerable only from the corpus (search);
- arithmetic ("What is 37 * 41 + 12?"): answerable by running code (enhance_reasoning).

The people are the records of the data-synthesis pipeline's shipped `people` domain
(data_synthesis/schemas/people.yaml, generated offline with seeded Faker), so the corpus and
tasks are the same on every machine; nothing is downloaded and ../shared is not read.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from data_synthesis.fake import generate_db
from data_synthesis.schema import load_schema
from orchestrator.loop import Task

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
    """`n` people with distinct full names, made by the data-synthesis pipeline's offline
    generator (`data_synthesis.fake.generate_db`, seeded Faker) on the shipped `people` schema
    (data_synthesis/schemas/people.yaml): the same records `python -m data_synthesis.synthesize
    --domain-dir people` puts in that domain's db.json."""
    records = generate_db(load_schema("people"), seed=seed, counts={"people": n + n // 4 + 8})["people"]
    names: set[str] = set()
    people = []
    for rec in records.values():      # spare rows stand in for the rare repeated full name
        name = f"{rec['first_name']} {rec['last_name']}"
        if name not in names:
            names.add(name)
            people.append(Person(id=rec["person_id"], name=name, city=rec["birth_city"], year=rec["birth_year"],
                                 occupation=rec["occupation"]))
        if len(people) == n:
            return people
    raise ValueError(f"build_people: only {len(people)} distinct names among {len(records)} records; ask for fewer")


def build_tasks(people: list[Person], n_lookup: int, n_arith: int, seed: int, cities: int | None = None) -> list[Task]:
    """`n_lookup` lookups (each about a different person: birth city or year) and `n_arith`
    arithmetic questions, shuffled.  A lookup asks the city or the year at random, or, given
    `cities`, exactly that many ask the city (in a random order)."""
    rng = random.Random(seed)
    tasks = []
    chosen = rng.sample(people, n_lookup)
    if cities is not None:
        kinds = ["city"] * cities + ["year"] * (n_lookup - cities)
        rng.shuffle(kinds)
    for i, p in enumerate(chosen):
        kind = kinds[i] if cities is not None else rng.choice(["city", "year"])
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
    _write_if_changed(corpus, "".join(json.dumps({"id": p.id, "contents": p.passage()}) + "\n" for p in people))
    _write_if_changed(tasks, "".join(json.dumps(asdict(t)) + "\n" for t in build_tasks(people, n_lookup, n_arith, seed)))
    return corpus, tasks


def write_gaia_split(tasks_path: Path, folder: Path) -> Path:
    """The world's tasks as a GAIA split folder (`folder`/metadata.jsonl + attached files, the
    layout of gaia-benchmark/GAIA's 2023/<split>/): each arithmetic question's numbers move into
    an attached CSV file (Level 2: the code tool must read it), lookups stay text (Level 1).
    Attachment tasks and lookups alternate, an attachment first.  Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(tasks_path)
    arith = [t for t in tasks if t.metadata.get("type") == "arithmetic"]
    lookup = [t for t in tasks if t.metadata.get("type") != "arithmetic"]
    rows = []
    for i in range(max(len(arith), len(lookup))):
        for task in (arith[i:i + 1] + lookup[i:i + 1]):
            row = {"task_id": task.id, "Question": task.question, "Level": 1, "Final answer": task.answer,
                   "file_name": "", "Annotator Metadata": {"Steps": "search the corpus", "Tools": "search"}}
            numbers = re.fullmatch(r"What is (\d+) \* (\d+) \+ (\d+)\?.*", task.question)
            if numbers:
                name = f"{task.id}.csv"
                _write_if_changed(folder / name, "a,b,c\n" + ",".join(numbers.groups()) + "\n")
                row.update(Question="The attached CSV file has one row with the columns a, b and c. "
                                    "What is a * b + c? Answer with the number only.",
                           Level=2, file_name=name,
                           **{"Annotator Metadata": {"Steps": "read the file; compute", "Tools": "code"}})
            rows.append(row)
    _write_if_changed(folder / "metadata.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _write_if_changed(path: Path, text: str) -> None:
    """Leave a file that already holds `text` untouched (an index over it stays current)."""
    if not (path.exists() and path.read_text() == text):
        path.write_text(text)


def load_tasks(path: Path) -> list[Task]:
    return [Task(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
