"""Keep evaluation benchmarks out of training data.

Upstream trains on a general reasoning QA corpus plus ToolScale, never on the benchmarks it
reports (PAPER.md §8b); training on FRAMES and then reporting FRAMES would measure recall.
`data_synthesis.dataset` therefore refuses, by default, a QA file whose questions overlap an
evaluation set it knows, and says which set and which records.

Known sets are question-text hashes shipped in `data_synthesis/eval_sets/<name>.txt` (one
16-hex-digit sha256 prefix of the normalised question per line: the benchmark text itself
is not copied into the repository).  Shipped: `frames` (all 824 questions of
../shared/benchmarks/frames/frames.jsonl, upstream's FRAMES file).  Not shipped: HLE (no copy
was at hand when this was written); add it, or any other benchmark, with

    python -m data_synthesis.contamination add hle cais/hle        # a local file or a HF id
    python -m data_synthesis.dataset ... --eval-set hle=path/to/hle.jsonl   # per run, not stored

ToolScale tasks (`dataset --toolscale`) are checked per record against the same sets plus
tau2-Bench's own tasks (`tau2_bench_sets`, from the installed tau2 package); a hit drops the record.

Normalisation: case-folded, every run of non-alphanumeric characters one space, stripped,
so a question that differs only in case, punctuation or spacing still matches.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

EVAL_SETS_DIR = Path(__file__).resolve().parent / "eval_sets"
HASH_CHARS = 16            # 64 bits: a false match among ~10^4 x 10^6 pairs has probability ~1e-9
_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def normalise(text: str) -> str:
    return _NON_ALNUM.sub(" ", text.casefold()).strip()


def question_hash(text: str) -> str:
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()[:HASH_CHARS]


def shipped_sets() -> dict[str, set[str]]:
    """{name: hashes} of every eval_sets/<name>.txt."""
    return {p.stem: set(p.read_text().split()) for p in sorted(EVAL_SETS_DIR.glob("*.txt"))}


def benchmark_hashes(benchmark: str, data: str) -> set[str]:
    """Question hashes of a benchmark file or HF id, read by orchestrator.benchmarks ("hle", "frames";
    any other name is read as a JSONL of {id, question, ...})."""
    from data_synthesis.examples import load_qa  # lazy: pulls in faker (slow): keeps --help fast
    from orchestrator.benchmarks import load_benchmark

    if benchmark in ("hle", "frames"):
        return {question_hash(t.question) for t in load_benchmark(benchmark, data).tasks}
    return {question_hash(r["question"]) for r in load_qa(data)}


def parse_eval_sets(items: Iterable[str]) -> dict[str, set[str]]:
    """`--eval-set NAME=FILE` arguments -> {name: hashes}; errors name the argument."""
    out: dict[str, set[str]] = {}
    for item in items:
        name, sep, data = item.partition("=")
        if not sep or not name or not data:
            raise ValueError(f"--eval-set {item!r}: expected NAME=FILE, e.g. hle=data/hle.jsonl")
        out[name] = benchmark_hashes(name, data)
    return out


def overlaps(rows: Iterable[Mapping], sets: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """{set name: ids of the rows whose question is in that set} (only sets with a hit)."""
    hits: dict[str, list[str]] = {}
    for row in rows:
        h = question_hash(str(row["question"]))
        for name, hashes in sets.items():
            if h in hashes:
                hits.setdefault(name, []).append(str(row.get("id", "?")))
    return hits


def check_not_eval(rows: list[Mapping], source: str, sets: Mapping[str, set[str]]) -> None:
    """Raise ValueError when any row's question is in a known evaluation set."""
    hits = overlaps(rows, sets)
    if not hits:
        return
    what = "; ".join(f"{len(ids)} of its {len(rows)} questions are in the evaluation set {name!r} "
                     f"(e.g. ids {ids[:3]})" for name, ids in sorted(hits.items()))
    raise ValueError(f"{source}: {what}. Training on an evaluation benchmark makes its scores meaningless: "
                     "use a non-benchmark QA source (your own JSONL, or a general QA dataset), or pass "
                     "--allow-eval-overlap if you really mean it")


def tau2_bench_sets() -> dict[str, set[str]]:
    """{"tau2-airline"|"tau2-retail"|"tau2-telecom": hashes of each task's `reason_for_call`}, read from
    the installed `tau2` package's task files (tau2-Bench is an evaluation set here); {} without it.
    Only `reason_for_call` is hashed: tau2's `task_instructions` are often generic persona lines
    ("You are detail-oriented ...") that a training task may share without copying the task."""
    try:
        from tau2.utils import DATA_DIR  # lazy: optional (tau2 extra), heavy
    except Exception:  # tau2 not installed, or its deps missing
        return {}

    out = {}
    for domain in ("airline", "retail", "telecom"):
        path = Path(DATA_DIR) / "tau2" / "domains" / domain / "tasks.json"
        if path.is_file():
            texts = (((t.get("user_scenario") or {}).get("instructions") or {}) for t in json.loads(path.read_text()))
            out[f"tau2-{domain}"] = {question_hash(i["reason_for_call"]) for i in texts
                                     if isinstance(i, dict) and i.get("reason_for_call")}
    return out


def task_overlap(texts: Iterable[str], sets: Mapping[str, set[str]]) -> str | None:
    """The first evaluation set holding any of `texts` (a task's reason for calling, its
    instructions), or None."""
    hashes = {question_hash(t) for t in texts if t}
    return next((name for name, known in sorted(sets.items()) if hashes & known), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_synthesis.contamination", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="store the question hashes of a benchmark as eval_sets/NAME.txt")
    add.add_argument("name", help="hle, frames, or another name (then FILE is a JSONL of {id, question, answer})")
    add.add_argument("data", help="a local file, or a Hugging Face dataset id (hle: cais/hle)")
    check = sub.add_parser("check", help="list the questions of a QA JSONL that are in a known evaluation set")
    check.add_argument("file")
    args = p.parse_args(argv)
    try:
        if args.command == "add":
            hashes = benchmark_hashes(args.name, args.data)
            if not hashes:
                raise ValueError(f"{args.data}: no questions read")
            EVAL_SETS_DIR.mkdir(exist_ok=True)
            (EVAL_SETS_DIR / f"{args.name}.txt").write_text("".join(h + "\n" for h in sorted(hashes)))
            print(f"wrote {len(hashes)} question hashes to {EVAL_SETS_DIR / (args.name + '.txt')}")
            return 0
        from data_synthesis.examples import load_qa  # lazy: pulls in faker (slow): keeps --help fast

        hits = overlaps(load_qa(args.file), shipped_sets())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, ids in sorted(hits.items()):
        print(f"{name}: {len(ids)} questions, ids {ids[:10]}{' ...' if len(ids) > 10 else ''}")
    if not hits:
        print("no overlap with", ", ".join(shipped_sets()) or "no known set")
    return 1 if hits else 0


if __name__ == "__main__":
    raise SystemExit(main())
