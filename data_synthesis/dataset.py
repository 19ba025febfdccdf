"""Write training examples with HF `datasets` (parquet + JSONL) and a dataset card.

    python -m data_synthesis.dataset --tau2 out/school out/bank --qa data/my_qa.jsonl \
        --out data/train --seed 0 [--per-item 2] [--limit-qa 200] [--price-jitter 2]

`--toolscale PATH_OR_HUB_ID --toolscale-domains DIR` adds NVIDIA's released ToolScale tasks
(data_synthesis/toolscale.py): each record checked, its gold actions replayed on its domain's
database, evaluation-set overlaps dropped; OUT/domains/<domain>/ gets the tau2 domain folders,
OUT/summary.json the kept / rejected counts per domain and reason.

QA files whose questions overlap an evaluation benchmark it knows (FRAMES; HLE once added,
data_synthesis/contamination.py) are refused, naming the benchmark and the records;
`--eval-set NAME=FILE` adds a benchmark for this run, `--allow-eval-overlap` lets them through.

Output folder: train.parquet, train.jsonl (same rows), README.md (counts per kind,
domain and difficulty; preference presets; how to read it).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

from datasets import Dataset, Features, Value, disable_progress_bars

from data_synthesis.contamination import check_not_eval, parse_eval_sets, shipped_sets, tau2_bench_sets
from data_synthesis.examples import Randomization, load_qa, qa_examples, tau2_examples
from data_synthesis.offline import atomic_write, dump_json
from data_synthesis.records import TrainingExample
from data_synthesis.schema import SchemaError
from data_synthesis.toolscale import check_records, convert, load_records
from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.domains.folder import load_domain

FEATURES = Features({
    "id": Value("string"), "kind": Value("string"), "domain": Value("string"), "difficulty": Value("string"),
    "question": Value("string"), "instruction": Value("string"), "answer": Value("string"),
    "tau2_task": Value("string"), "domain_dir": Value("string"), "tools": Value("string"),
    "prices": Value("string"), "latency_s": Value("string"), "preference": Value("string"),
    "preference_name": Value("string"), "preference_text": Value("string"), "seed": Value("int64"),
    "source": Value("string"),
})


def write_dataset(examples: list[TrainingExample], out: Path, title: str, command: str = "") -> dict:
    """Write train.parquet, train.jsonl and README.md under `out`; return the counts."""
    if not examples:
        raise ValueError("no examples to write: every input was empty or dropped")
    ids = [e.id for e in examples]
    dupes = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dupes:
        raise ValueError(f"duplicate example ids {dupes[:3]}: pass each domain / QA file once")
    out.mkdir(parents=True, exist_ok=True)
    disable_progress_bars()  # the callers show their own progress
    ds = Dataset.from_list([e.to_row() for e in examples], features=FEATURES)
    for name, write in (("train.parquet", ds.to_parquet), ("train.jsonl", ds.to_json)):
        tmp = out / f".{name}.tmp"
        write(str(tmp)) if name.endswith("parquet") else write(str(tmp), lines=True, force_ascii=False)
        tmp.replace(out / name)  # atomic: readers never see half a file
    counts = dataset_counts(examples)
    atomic_write(out / "README.md", dataset_card(counts, title, command))
    return counts


def dataset_counts(examples: list[TrainingExample]) -> dict:
    by = Counter((e.kind, e.domain, e.difficulty) for e in examples)
    return {"total": len(examples),
            "by_kind": dict(sorted(Counter(e.kind for e in examples).items())),
            "by_domain_difficulty": [{"kind": k, "domain": d, "difficulty": lvl, "count": n}
                                     for (k, d, lvl), n in sorted(by.items())],
            "by_preference": dict(sorted(Counter(e.preference_name.split(":")[0] for e in examples).items()))}


def dataset_card(counts: dict, title: str, command: str) -> str:
    levels = ["easy", "medium", "hard", "unrated"]
    table = {}
    for row in counts["by_domain_difficulty"]:
        table.setdefault((row["kind"], row["domain"]), Counter())[row["difficulty"]] += row["count"]
    lines = ["---", "configs:", "- config_name: default", "  data_files:", "  - split: train",
             "    path: train.parquet", "---", f"# {title}", "",
             "Training examples for the ToolOrchestra reproduction, written by `data_synthesis`. Each row is a",
             "QA question or a tau2 task with its own randomised tool subset, alias -> model mapping, prices and",
             "preference vector, all also stated in `instruction`. Field reference: docs/data_synthesis.md.",
             "Mapping-valued columns (`tools`, `prices`, `latency_s`, `preference`, `tau2_task`) are JSON text;",
             "read rows with `data_synthesis.records.load_examples(path)` or `TrainingExample.from_row(row)`.", "",
             f"Total: {counts['total']} examples ({', '.join(f'{k}: {n}' for k, n in counts['by_kind'].items())}).",
             "", "| kind | domain | " + " | ".join(levels) + " | total |", "|---|---|" + "---:|" * (len(levels) + 1)]
    for (kind, domain), per in sorted(table.items()):
        lines.append(f"| {kind} | {domain} | " + " | ".join(str(per.get(lvl, 0)) for lvl in levels)
                     + f" | {sum(per.values())} |")
    lines += ["", "Preference presets: " + ", ".join(f"{k} {n}" for k, n in counts["by_preference"].items()) + "."]
    if command:
        lines += ["", "Made with:", "", f"    {command}"]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_synthesis.dataset", description=__doc__.split("\n\n")[0])
    p.add_argument("--tau2", nargs="*", default=[], metavar="DIR", help="domain folders with tasks.json")
    p.add_argument("--qa", nargs="*", default=[], metavar="FILE",
                   help="QA JSONL {id, question, answer} (not an evaluation benchmark: checked, see --eval-set)")
    p.add_argument("--toolscale", default=None, metavar="PATH_OR_HUB_ID",
                   help="ToolScale tau2 tasks: a .parquet/.jsonl/.json file, a folder of them (a hub snapshot), "
                        "or a Hugging Face dataset id (nvidia/ToolScale)")
    p.add_argument("--toolscale-domains", default=None, metavar="DIR",
                   help="(--toolscale) folder of domain folders <domain>/{db.json, policy.md[, tools.py]}, "
                        "e.g. ../shared/benchmarks/toolscale/domains")
    p.add_argument("--toolscale-upstream", default=None, metavar="CHECKOUT",
                   help="(--toolscale) a ToolOrchestra checkout: its domains run on upstream's own tau2 tools "
                        "(training/rollout/tau2/domains/<domain>/, imported at run time); the others on their "
                        "tools.py or the generic toolkit. Default --toolscale-domains: CHECKOUT/data/tau2/domains")
    p.add_argument("--toolscale-split", default="train", help="(--toolscale hub id) the split to read")
    p.add_argument("--skip-unknown-domains", action="store_true",
                   help="(--toolscale) count and skip records whose domain has no folder, instead of stopping")
    p.add_argument("--eval-set", action="append", default=[], metavar="NAME=FILE",
                   help="another evaluation benchmark the QA files must not overlap (hle=FILE, frames=FILE, or "
                        "NAME=JSONL of {id, question}); the shipped hashes (data_synthesis/eval_sets) always count")
    p.add_argument("--allow-eval-overlap", action="store_true",
                   help="keep QA questions and ToolScale tasks that are in an evaluation benchmark "
                        "(their scores then mean little)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-item", type=int, default=1, help="randomised examples per task/question")
    p.add_argument("--limit-qa", type=int, default=None, help="first N questions of each QA file")
    p.add_argument("--price-jitter", type=float, default=2.0, help="price factor range [1/j, j] (1 = none)")
    p.add_argument("--catalog", default=None, help="tools.json (default: the repository's)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.tau2 and not args.qa and not args.toolscale:
        p.error("give at least one --tau2 DIR, --qa FILE or --toolscale PATH_OR_HUB_ID")
    if args.toolscale_upstream and not args.toolscale:
        p.error("--toolscale-upstream needs --toolscale PATH_OR_HUB_ID (the records); to list a checkout's domains: "
                "python -m data_synthesis.toolscale --toolscale-upstream CHECKOUT --list")
    if args.toolscale and not args.toolscale_domains and args.toolscale_upstream:
        from data_synthesis.toolscale import upstream_data_dir
        args.toolscale_domains = str(upstream_data_dir(Path(args.toolscale_upstream)))
    if args.toolscale and not args.toolscale_domains:
        p.error("--toolscale needs --toolscale-domains DIR (the domain folders: db.json, policy.md[, tools.py]) or "
                "--toolscale-upstream CHECKOUT, e.g. --toolscale-domains ../shared/benchmarks/toolscale/domains")
    try:
        eval_sets = {} if args.allow_eval_overlap else {**shipped_sets(), **parse_eval_sets(args.eval_set)}
        catalog = load_catalog(args.catalog)
        cfg = Randomization(price_jitter=args.price_jitter)
        examples = []
        for d in args.tau2:
            dom = load_domain(d)
            # relative to the output folder, so the dataset and its domains move together
            rel = os.path.relpath(Path(d).resolve(), Path(args.out).resolve())
            examples += tau2_examples(dom.tasks, dom.name, catalog, args.seed, cfg, rel, args.per_item, d)
        for f in args.qa:
            rows = load_qa(f)[: args.limit_qa]
            check_not_eval(rows, f"--qa {f}", eval_sets)
            examples += qa_examples(rows, Path(f).stem, catalog, args.seed, cfg, args.per_item, f)
        if args.toolscale:   # last: it writes OUT/domains and OUT/summary.json, after the QA files passed
            examples += toolscale_examples(args, catalog, cfg, eval_sets)
        counts = write_dataset(examples, Path(args.out), "ToolOrchestra training examples",
                               "python -m data_synthesis.dataset " + " ".join(argv if argv is not None else sys.argv[1:]))
    except (ValueError, SchemaError, CatalogError) as exc:   # ToolScaleError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {counts['total']} examples to {args.out} ({counts['by_kind']})")
    return 0


def toolscale_examples(args: argparse.Namespace, catalog, cfg, eval_sets: dict[str, set[str]]) -> list:
    """The ToolScale records of `args.toolscale` that pass, as training examples; writes
    OUT/domains/<domain>/ and OUT/summary.json and prints the kept / rejected table."""
    from rich.console import Console  # lazy: display only, slow to import
    from tqdm import tqdm  # lazy: display only

    out = Path(args.out)
    upstream = Path(args.toolscale_upstream) if args.toolscale_upstream else None
    if upstream is not None:
        from orchestrator.domains.upstream import checkout_domains
        checkout_domains(upstream)   # a bad checkout fails here, before the records are read
    records = load_records(args.toolscale, args.toolscale_split)
    if not records:
        raise ValueError(f"--toolscale {args.toolscale}: no records read")
    check_records(records, args.toolscale, Path(args.toolscale_domains), args.skip_unknown_domains)  # before the bar
    sets = {} if args.allow_eval_overlap else {**eval_sets, **tau2_bench_sets()}
    with tqdm(total=len(records), desc="toolscale records", unit="record", file=sys.stderr) as bar:
        conv = convert(records, args.toolscale, Path(args.toolscale_domains), out, sets,
                       args.skip_unknown_domains, progress=bar.update, upstream=upstream)
    summary = {"source": args.toolscale, "domains_dir": args.toolscale_domains, "upstream": args.toolscale_upstream,
               "eval_sets": sorted(sets), **conv.summary()}
    atomic_write(out / "summary.json", dump_json({"toolscale": summary}))
    Console(stderr=True).print(toolscale_table(summary))
    if not summary["kept"]:
        raise ValueError(f"--toolscale {args.toolscale}: all {summary['records']} records were rejected; "
                         f"reasons per domain in {out / 'summary.json'}")
    examples = []
    for name, tasks in conv.tasks.items():
        examples += tau2_examples(tasks, name, catalog, args.seed, cfg, f"domains/{name}", args.per_item,
                                  f"toolscale:{args.toolscale}")
    return examples


def toolscale_table(summary: dict):
    from rich.table import Table  # lazy: display only, slow to import

    table = Table(title=f"ToolScale {summary['source']}: {summary['kept']} of {summary['records']} records kept")
    for col, justify in (("domain", "left"), ("records", "right"), ("kept", "right"), ("rejected", "right"),
                         ("could run, per toolkit", "left"), ("toolkit", "left")):
        table.add_column(col, justify=justify)
    for name, d in summary["domains"].items():
        runs = ", ".join(f"{kind} {n}" for kind, n in d.get("runs", {}).items())
        table.add_row(name, str(d["generated"]), str(d["kept"]), str(d["generated"] - d["kept"]), runs,
                      d["toolkit"] or "")
        for reason, n in d["dropped"].items():
            table.add_row(f"  {reason}", "", "", str(n), "", "")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
