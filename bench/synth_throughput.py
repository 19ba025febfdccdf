"""Data synthesis throughput: verified tasks per minute offline, and with a local LLM
the fraction of LLM-written task drafts that pass verification.

    python bench/synth_throughput.py [--tasks 200] [--repeats 3] [--domains school bank railway]
                                     [--llm smollm2-135m --llm-tasks 2 --llm-max-tokens 200] [--write]

Offline: `build_domain` wall seconds (environment files + tasks, imports warmed up
first), median over repeats.  LLM: one `LLMPipeline.build` on the shipped school schema
(the model writes extra tools, the policy, intents and tasks).  --write puts the tables
into the "Data synthesis" section of docs/benchmarks.md (other sections kept).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _report import write_section  # noqa: E402

from data_synthesis.offline import build_domain, resolve_source  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLSCALE = ROOT.parent / "shared" / "benchmarks" / "toolscale" / "domains"
SECTION = "## Data synthesis"
MACHINE = "2-core CPU, 24 GiB; shared with other workers during measurement"


def _source_for(name: str):
    return resolve_source(name if name == "school" else TOOLSCALE / name, seed=0)


def offline(domains: list[str], n: int, repeats: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        build_domain(_source_for("school"), Path(tmp) / "warm", 5, seed=0)  # imports, tau2 model
        for name in domains:
            source = _source_for(name)
            times, result = [], None
            for r in range(repeats):
                start = time.perf_counter()
                result = build_domain(source, Path(tmp) / f"{name}{r}", n, seed=r)
                times.append(time.perf_counter() - start)
            med = statistics.median(times)
            rows.append({"domain": name, "origin": result.extra["origin"].split(" of ")[0], "tools": result.n_tools,
                         "kept": len(result.tasks), "generated": result.tally["generated"], "median_s": med,
                         "per_min": 60 * len(result.tasks) / med})
    return rows


def llm(model: str, n: int, max_tokens: int, retries: int, timeout_s: float) -> dict:
    from data_synthesis.llm_pipeline import LLMPipeline
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = LLMPipeline(model, seed=0, retries=retries, max_tokens=max_tokens, timeout_s=timeout_s)
        start = time.perf_counter()
        result = pipeline.build("school", Path(tmp) / "llm", n, records=6)
        seconds = time.perf_counter() - start
    steps = result.extra["steps"]
    drafts = steps.get("task", {}).get("ok", 0) + steps.get("task", {}).get("dropped", 0)
    return {"model": model, "seconds": seconds, "calls": result.extra["summary"]["llm_calls"],
            "task_drafts": drafts, "kept": len(result.tasks), "steps": steps,
            "llm_tools": result.extra["summary"]["llm_tools"], "policy": result.extra["summary"]["policy"],
            "max_tokens": max_tokens, "retries": retries,
            "first_errors": {s: errs[0] for s, errs in pipeline.runner.errors.items() if errs}}


def render(rows: list[dict], n: int, repeats: int, llm_row: dict | None, command: str) -> str:
    lines = [SECTION, "", f"Machine: {MACHINE}. Python {sys.version.split()[0]}.", "",
             f"Command: `{command}`", "",
             f"Offline (no LLM): {n} verified tasks per domain, median wall seconds of {repeats} runs "
             "(schema/db/tools/policy files, task sampling, tau2 Task validation, replay on a fresh "
             "database, de-duplication).", "",
             "| domain | records | tools | kept / generated | median s | verified tasks per minute |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['domain']} | {r['origin']} | {r['tools']} | {r['kept']} / {r['generated']} | "
                     f"{r['median_s']:.1f} | {r['per_min']:.0f} |")
    if llm_row:
        frac = llm_row["kept"] / llm_row["task_drafts"] if llm_row["task_drafts"] else 0.0
        lines += ["", f"LLM mode with `{llm_row['model']}` through LLM_CALL on the shipped school schema "
                  f"(the model writes extra tools, policy, intents, tasks; {llm_row['max_tokens']} completion "
                  f"tokens per call at most, {llm_row['retries']} retries per step):", "",
                  "| LLM calls | wall s | task drafts | verified tasks | fraction passing | LLM tools kept | policy |",
                  "|---:|---:|---:|---:|---:|---:|---|",
                  f"| {llm_row['calls']} | {llm_row['seconds']:.0f} | {llm_row['task_drafts']} | {llm_row['kept']} | "
                  f"{frac:.0%} | {len(llm_row['llm_tools'].get('kept', []))} | {llm_row['policy']} |", "",
                  "Per step (ok / retried / dropped, of which LLM call failed): " + "; ".join(
                      f"{s} {c.get('ok', 0)}/{c.get('retried', 0)}/{c.get('dropped', 0)} ({c.get('call_error', 0)})"
                      for s, c in llm_row["steps"].items()) + ".",
                  "", "First problem per step: " + "; ".join(
                      f"{s}: {e[:160]!r}" for s, e in llm_row["first_errors"].items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--domains", nargs="*", default=["school", "bank", "railway"])
    p.add_argument("--llm", default=None, help="LLM_CALL model for the LLM row (e.g. smollm2-135m)")
    p.add_argument("--llm-tasks", type=int, default=2)
    p.add_argument("--llm-max-tokens", type=int, default=200)
    p.add_argument("--llm-retries", type=int, default=1)
    p.add_argument("--llm-timeout", type=float, default=900, help="seconds per LLM call attempt")
    p.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = p.parse_args()
    missing = [d for d in args.domains if d != "school" and not (TOOLSCALE / d).is_dir()]
    if missing:
        p.error(f"{missing}: not in {TOOLSCALE}")
    rows = offline(args.domains, args.tasks, args.repeats)
    llm_row = (llm(args.llm, args.llm_tasks, args.llm_max_tokens, args.llm_retries, args.llm_timeout)
               if args.llm else None)
    command = "python bench/synth_throughput.py " + " ".join(sys.argv[1:])
    text = render(rows, args.tasks, args.repeats, llm_row, command)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
