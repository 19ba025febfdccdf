"""Build a tau2 domain and verified tasks (offline, or with an LLM), plus training records.

    python -m data_synthesis.synthesize --domain-dir school --out out/school --num-tasks 200 --seed 0
    python -m data_synthesis.synthesize --domain-dir ../shared/benchmarks/toolscale/domains/bank \\
        --out out/bank --num-tasks 300
    python -m data_synthesis.synthesize --domain-dir library --llm MODEL --out out/library --num-tasks 50

--domain-dir: a shipped schema name (school), a schema .yaml, or a folder with db.json
(schema inferred, records kept unless --fake) and/or schema.yaml.  With --llm it is the
domain *name* (or a folder whose schema seeds the LLM), see docs/data_synthesis.md.

Writes OUT/{schema.yaml, db.json, tools.py, policy.md, tasks.json, summary.json} and
OUT/dataset/{train.parquet, train.jsonl, README.md}.  Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from data_synthesis.examples import Randomization, tau2_examples
from data_synthesis.llm_pipeline import LLMPipeline
from data_synthesis.offline import DomainResult, atomic_write, build_domain, dump_json, resolve_source
from data_synthesis.schema import SchemaError
from orchestrator.catalog import load_catalog


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data_synthesis.synthesize",
                                description="Synthesise a tau2 domain with verified tasks and training records.")
    p.add_argument("--domain-dir", required=True, help="shipped schema name, schema file, or domain folder")
    p.add_argument("--out", required=True, help="output folder (becomes a tau2 domain folder)")
    p.add_argument("--num-tasks", type=int, required=True, help="verified tasks to keep")
    p.add_argument("--llm", default=None, metavar="MODEL", help="LLM_CALL model for the LLM pipeline (else offline)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fake", action="store_true", help="replace an existing db.json's records with Faker records")
    p.add_argument("--records", type=int, default=None, metavar="N",
                   help="records per collection for Faker/LLM databases (default: the schema's counts)")
    p.add_argument("--examples-per-task", type=int, default=1, help="randomised training examples per task")
    p.add_argument("--no-dataset", action="store_true", help="skip OUT/dataset")
    p.add_argument("--description", default="", help="(--llm) a sentence that seeds the domain")
    p.add_argument("--llm-retries", type=int, default=2, help="(--llm) retries per step after a failed check")
    p.add_argument("--llm-max-tokens", type=int, default=4096, help="(--llm) completion tokens per call, at most")
    p.add_argument("--llm-temperature", type=float, default=0.7)
    p.add_argument("--llm-timeout", type=float, default=None, help="(--llm) seconds per call attempt "
                   "(default: the model's timeout_s in configs/models.yaml)")
    args = p.parse_args(argv)
    for name in ("num_tasks", "examples_per_task"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.records is not None and args.records < 1:
        p.error("--records must be >= 1")
    if args.llm_retries < 0 or args.llm_max_tokens < 16:
        p.error("--llm-retries must be >= 0 and --llm-max-tokens >= 16")
    return args


def run_offline(args: argparse.Namespace, out: Path) -> DomainResult:
    source = resolve_source(args.domain_dir, seed=args.seed, fake=args.fake, records=args.records)
    with tqdm(total=args.num_tasks, desc=f"tasks {source.schema.domain}", unit="task", file=sys.stderr) as bar:
        return build_domain(source, out, args.num_tasks, args.seed, progress=bar.update)


def run_llm(args: argparse.Namespace, out: Path) -> DomainResult:
    pipeline = LLMPipeline(model=args.llm, seed=args.seed, retries=args.llm_retries,
                           max_tokens=args.llm_max_tokens, temperature=args.llm_temperature,
                           timeout_s=args.llm_timeout)
    with tqdm(total=args.num_tasks, desc=f"tasks {args.domain_dir} (llm)", unit="task", file=sys.stderr) as bar:
        return pipeline.build(args.domain_dir, out, args.num_tasks, description=args.description,
                              records=args.records, progress=bar.update)


def write_records(result: DomainResult, out: Path, domain: str, args: argparse.Namespace, command: str) -> dict:
    from data_synthesis.dataset import write_dataset  # lazy: pulls in datasets
    # domain_dir is stored relative to the dataset folder, so the output can move as a whole
    examples = tau2_examples(result.tasks, domain, load_catalog(), args.seed, Randomization(), "..",
                             args.examples_per_task, f"synthesize:{domain}")
    return write_dataset(examples, out / "dataset", f"{domain}: synthesised tau2 tasks", command)


def summary_table(result: DomainResult, domain: str, seconds: float) -> Table:
    tally = result.tally
    table = Table(title=f"{domain}: {result.path}  ({result.n_tools} tools, {result.extra.get('origin', '')})")
    table.add_column("tasks", justify="left")
    table.add_column("count", justify="right")
    table.add_row("generated", str(tally["generated"]))
    table.add_row("kept", str(tally["kept"]))
    table.add_row("dropped", str(tally["generated"] - tally["kept"]))
    for reason, n in tally["dropped"].items():
        table.add_row(f"  {reason}", str(n))
    for step, counts in (result.extra.get("steps") or {}).items():
        table.add_row(f"llm step {step}", ", ".join(f"{k} {v}" for k, v in counts.items()))
    rate = 60 * tally["kept"] / seconds if seconds > 0 else 0.0
    table.caption = f"{seconds:.1f} s, {rate:.0f} kept tasks per minute"
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    console = Console()
    # The command as recorded in the outputs leaves out --out, so that two runs into
    # different folders write identical bytes.
    raw = list(argv if argv is not None else sys.argv[1:])
    kept_args = [a for i, a in enumerate(raw) if a != "--out" and (i == 0 or raw[i - 1] != "--out")
                 and not a.startswith("--out=")]
    command = "python -m data_synthesis.synthesize " + " ".join(kept_args)
    start = time.perf_counter()
    try:
        result = run_llm(args, out) if args.llm else run_offline(args, out)
        domain = result.extra.get("domain") or _domain_name(out)
        summary = {"command": command, "domain": domain, "mode": "llm" if args.llm else "offline",
                   "origin": result.extra.get("origin", ""), "tools": result.n_tools, **result.tally,
                   "llm_steps": result.extra.get("steps", {}), **result.extra.get("summary", {})}
        if not args.no_dataset and result.tasks:
            summary["dataset"] = write_records(result, out, domain, args, command)
        atomic_write(out / "summary.json", dump_json(summary))
    except (SchemaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # one unwrapped line that names the file/field
        return 1
    console.print(summary_table(result, domain, time.perf_counter() - start))
    if len(result.tasks) < args.num_tasks:
        console.print(f"[yellow]only {len(result.tasks)} of {args.num_tasks} tasks verified[/yellow] "
                      "(the domain has too few distinct rows/intents, or too many drafts failed; see above)")
    return 0


def _domain_name(out: Path) -> str:
    return (yaml.safe_load((out / "schema.yaml").read_text()) or {}).get("domain", out.name)


if __name__ == "__main__":
    raise SystemExit(main())
