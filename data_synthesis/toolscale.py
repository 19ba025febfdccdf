"""NVIDIA's released ToolScale tasks (`nvidia/ToolScale`) as tau2 domain folders and training records.

    python -m data_synthesis.dataset --toolscale nvidia/ToolScale \\
        --toolscale-domains ../shared/benchmarks/toolscale/domains --out data/toolscale

A ToolScale record is a tau2 `Task`: `id`, `description`, `user_scenario.instructions`
{task_instructions, reason_for_call, known_info, unknown_info, domain}, `initial_state`,
`evaluation_criteria` {actions [{action_id, name, arguments}], communicate_info, nl_assertions}.
Records come from a local .parquet / .jsonl / .json file, a folder of them (a downloaded
snapshot of the hub dataset: `data/train-*.parquet`), or a hub id read with `datasets`.

Each record's domain is a folder `<domains>/<domain>/` with db.json and policy.md (the shared
copy has seven of the ten domains) and optionally tools.py (docs/data_synthesis.md, "tools.py
contract").  The dataset ships no tool code; upstream's tools live in a ToolOrchestra checkout
(training/rollout/tau2/domains/<domain>/).  Each domain's toolkit, first that applies:

1. `--toolscale-upstream CHECKOUT` has the domain: upstream's own tau2 toolkit, imported from the
   checkout at run time (orchestrator/domains/upstream.py); the output folder gets db.json,
   policy.md and `upstream.json` (the checkout's path), no tools.py;
2. the domain folder has a tools.py: that one;
3. else the generic toolkit derived from its db.json (the offline pipeline's).

A gold action calling a tool the toolkit lacks, or with arguments it does not take, is rejected
like any failing action.  Under upstream's tools every record is also replayed on the generic
toolkit, only to count: the summary's `runs` says how many records each toolkit could run.

    python -m data_synthesis.toolscale --toolscale-upstream CHECKOUT --list   # domains, tool counts
Every record is checked in order: evaluation overlap (contamination.py), tau2 task shape,
gold-action replay on a fresh database (verify.py); rejections are counted per domain and reason.

Arrow (parquet, the hub) pads every action's `arguments` to the union of all tools' argument
names with nulls, and stores date strings it recognised as timestamps: here null arguments are
dropped again and timestamps written back as ISO text (a date at midnight as YYYY-MM-DD).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_synthesis.contamination import task_overlap
from data_synthesis.offline import (
    atomic_write,
    dump_json,
    resolve_source,
    write_environment,
)
from data_synthesis.tasks import difficulty
from data_synthesis.verify import Tally, replay_reason, task_shape_reason
from orchestrator.domains.folder import Domain, SchemaError, load_domain
from orchestrator.domains.upstream import (
    DATA_DIR,
    UpstreamDomain,
    UpstreamError,
    checkout_domains,
    load_upstream_domain,
    skipped_domains,
    write_marker,
)

INSTRUCTION_FIELDS = ("task_instructions", "reason_for_call", "known_info", "unknown_info", "domain")
NULLABLE = ("known_info", "unknown_info")      # tau2 allows None there; the key must still be present
ACTION_FIELDS = ("action_id", "name", "arguments")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
SHAPE = ("a ToolScale record is a tau2 task: id, user_scenario.instructions{task_instructions, reason_for_call, "
         "known_info, unknown_info, domain}, evaluation_criteria.actions[{action_id, name, arguments}]")
DOMAIN_FILES = ("db.json", "policy.md", "tools.py", "schema.yaml")


class ToolScaleError(ValueError):
    """Bad input, as one line naming the file / record / field and the fix."""


# ------------------------------------------------------------------------------------------ reading
def load_records(source: str, split: str = "train") -> list[dict]:
    """The records of a local file or folder, or of a hub dataset id (its `split`)."""
    path = Path(source)
    if path.exists():
        files = data_files(path)
        return [rec for f in files for rec in read_file(f)]
    if HUB_ID.fullmatch(source):
        return read_hub(source, split)
    raise ToolScaleError(f"--toolscale {source}: no such file or folder, and not a Hugging Face dataset id "
                         "(owner/name, e.g. nvidia/ToolScale)")


def data_files(path: Path) -> list[Path]:
    """A file as is; a folder's .parquet files (any depth, as a hub snapshot has them under data/),
    else its .jsonl, else its .json files."""
    if path.is_file():
        if path.suffix not in DATA_SUFFIXES:
            raise ToolScaleError(f"--toolscale {path}: not a .parquet, .jsonl or .json file")
        return [path]
    for suffix in DATA_SUFFIXES:
        files = sorted(p for p in path.rglob(f"*{suffix}") if not any(part.startswith(".") for part in p.parts))
        if files:
            return files
    raise ToolScaleError(f"--toolscale {path}: the folder holds no .parquet, .jsonl or .json file")


def read_file(path: Path) -> list[dict]:
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq
            return [arrow_row(r) for r in pq.read_table(path).to_pylist()]
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolScaleError(f"--toolscale {path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except Exception as exc:  # pyarrow's ArrowInvalid & co: a damaged or non-parquet file
        raise ToolScaleError(f"--toolscale {path}: not a readable parquet file: {str(exc).splitlines()[0]}") from None
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                rows.append(_json(line, f"{path}:{n}"))
        return rows
    value = _json(text, str(path))
    if isinstance(value, dict) and "id" in value:
        value = [value]
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise ToolScaleError(f"--toolscale {path}: expected a JSON list of task objects (as tau2's tasks.json)")
    return value


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolScaleError(f"--toolscale {where}: invalid JSON: {exc.msg} (line {exc.lineno} "
                             f"column {exc.colno})") from None


def read_hub(dataset_id: str, split: str) -> list[dict]:
    """`datasets.load_dataset(dataset_id, split=split)` rows (downloads unless cached)."""
    from datasets import load_dataset
    try:
        ds = load_dataset(dataset_id, split=split)
    except Exception as exc:  # offline, unknown id, gated, no such split
        raise ToolScaleError(
            f"--toolscale {dataset_id}: cannot load it from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); download it where the hub is reachable "
            f"(huggingface-cli download {dataset_id} --repo-type dataset --local-dir DIR) and pass DIR") from None
    return [arrow_row(r) for r in ds.to_list()]


def arrow_row(row: dict) -> dict:
    """Undo Arrow's struct padding (null arguments) and timestamp inference in one record."""
    row = _plain(row)
    for action in ((row.get("evaluation_criteria") or {}).get("actions") or []):
        if isinstance(action, dict) and isinstance(action.get("arguments"), dict):
            action["arguments"] = {k: v for k, v in action["arguments"].items() if v is not None}
    return row


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() and value.tzinfo is None else value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


# ------------------------------------------------------------------------------------------ checking
def record_id(record: dict, index: int) -> str:
    rid = record.get("id")
    return str(rid) if isinstance(rid, (str, int)) and str(rid) != "" else f"#{index} (no id)"


def check_record(record: dict, index: int, source: str) -> None:
    """ToolScaleError naming the record and the first missing or mistyped field."""
    rid = record_id(record, index)

    def bad(field_: str, what: str = "missing field") -> ToolScaleError:
        return ToolScaleError(f"--toolscale {source}: record {rid}: {what} {field_!r}; {SHAPE}")

    if rid.startswith("#"):
        raise bad("id")
    instr = (record.get("user_scenario") or {}).get("instructions") if isinstance(record.get("user_scenario"), dict) \
        else None
    if not isinstance(instr, dict):
        raise bad("user_scenario.instructions")
    for name in INSTRUCTION_FIELDS:
        value = instr.get(name)
        if name not in instr or (value is None and name not in NULLABLE):
            raise bad(f"user_scenario.instructions.{name}")
        if value is not None and not isinstance(value, str):
            raise bad(f"user_scenario.instructions.{name}", f"not a string ({type(value).__name__}):")
    if not instr["domain"].strip():
        raise bad("user_scenario.instructions.domain", "empty field")
    criteria = record.get("evaluation_criteria")
    actions = criteria.get("actions") if isinstance(criteria, dict) else None
    if not isinstance(actions, list):
        raise bad("evaluation_criteria.actions")
    for i, action in enumerate(actions):
        for name in ACTION_FIELDS:
            if not isinstance(action, dict) or action.get(name) is None:
                raise bad(f"evaluation_criteria.actions[{i}].{name}")
        if not isinstance(action["arguments"], dict):
            raise bad(f"evaluation_criteria.actions[{i}].arguments", "not an object:")


def to_task(record: dict) -> dict:
    """The record as a tau2 Task dict: id as text, `description.notes` carrying our metadata
    (source, difficulty from the gold actions; the record's own notes kept under `notes`)."""
    task = json.loads(json.dumps(record, default=str))   # a private copy, JSON types only
    task["id"] = str(task["id"])
    actions = task["evaluation_criteria"]["actions"]
    for a in actions:
        a["action_id"] = str(a["action_id"])
    description = task.get("description") if isinstance(task.get("description"), dict) else {}
    meta = {"source": "toolscale", "difficulty": difficulty(len(actions), []), "notes": description.get("notes")}
    task["description"] = {**description, "notes": json.dumps(meta)}
    return task


# ------------------------------------------------------------------------------------------ domains
GENERIC = "generic toolkit derived from db.json (no tools.py)"


@dataclass
class DomainEnv:
    """One domain's output folder, loaded, and where its tools came from.  `domain` is a tools.py
    folder (orchestrator/domains/folder.py) or upstream's toolkit (orchestrator/domains/upstream.py); both
    give `db`, `fresh_db()`, `call()`, `tool_types`.  `kind`: upstream, tools.py or generic;
    `generic`: with upstream's tools, the generic toolkit too (to count what it could run)."""

    name: str
    path: Path
    domain: Domain | UpstreamDomain
    toolkit: str
    kind: str = "generic"
    generic: Domain | None = None

    def call(self, db: dict, name: str, arguments: dict) -> Any:
        return self.domain.call(db, name, arguments)


def available_domains(domains_dir: Path) -> list[str]:
    return sorted(p.name for p in domains_dir.iterdir() if (p / "db.json").is_file())


def generic_domain(src: Path) -> Domain:
    """The generic toolkit of `src`'s db.json, loaded from a scratch folder (nothing kept on disk)."""
    with tempfile.TemporaryDirectory(prefix="toolscale-generic-") as tmp:
        write_environment(resolve_source(src), Path(tmp) / src.name)
        return load_domain(Path(tmp) / src.name)


def prepare_domain(src: Path, out: Path, upstream: Path | None = None) -> DomainEnv:
    """Write the domain folder `out` from `src` and load it: upstream's tools when the checkout
    `upstream` has the domain (db.json, policy.md, upstream.json), else `src`'s tools.py (copied),
    else the generic toolkit derived from db.json."""
    if upstream is not None and src.name in checkout_domains(upstream):
        for name in ("db.json", "policy.md"):
            if (src / name).is_file():
                atomic_write(out / name, (src / name).read_text(encoding="utf-8"))
        write_marker(out, upstream, src.name)
        domain = load_upstream_domain(upstream, src.name, data_dir=out)
        return DomainEnv(src.name, out, domain, domain.toolkit_label, "upstream", generic_domain(src))
    if (src / "tools.py").is_file():
        for name in DOMAIN_FILES:
            if (src / name).is_file():
                atomic_write(out / name, (src / name).read_text(encoding="utf-8"))
        return DomainEnv(src.name, out, load_domain(out), f"{src / 'tools.py'}", "tools.py")
    write_environment(resolve_source(src), out)
    return DomainEnv(src.name, out, load_domain(out), GENERIC, "generic")


def upstream_data_dir(checkout: Path) -> Path:
    """Where a checkout keeps the domains' db.json and policy.md (the default --toolscale-domains)."""
    return checkout / DATA_DIR


# ------------------------------------------------------------------------------------------ converting
@dataclass
class Conversion:
    """Kept tasks and counts per domain (domains in first-seen order)."""

    tasks: dict[str, list[dict]] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)
    rejected_ids: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    envs: dict[str, DomainEnv] = field(default_factory=dict)
    runs: dict[str, Counter] = field(default_factory=dict)   # domain -> {toolkit kind: records it could run}
    upstream: Path | None = None                             # --toolscale-upstream

    def reject(self, domain: str, reason: str, rid: str) -> None:
        head = self.tallies[domain].drop(reason)
        ids = self.rejected_ids.setdefault(domain, {}).setdefault(head, [])
        if len(ids) < 5:
            ids.append(rid)

    def summary(self) -> dict:
        domains = {}
        for name, tally in self.tallies.items():
            env = self.envs.get(name)
            runs = dict(self.runs.get(name, {}))
            if env is not None:   # every toolkit tried, also one that ran none
                runs = {env.kind: runs.get(env.kind, 0), **({"generic": runs.get("generic", 0)} if env.generic
                                                             else {})}
            domains[name] = {"toolkit": env.toolkit if env else None, **tally.as_dict(), "runs": runs,
                             "rejected_ids": self.rejected_ids.get(name, {})}
        total = sum(t.generated for t in self.tallies.values())
        kept = sum(t.kept for t in self.tallies.values())
        return {"records": total, "kept": kept, "rejected": total - kept, "domains": domains}


def check_records(records: list[dict], source: str, domains_dir: Path, skip_unknown_domains: bool = False) -> list[str]:
    """Every record's shape and domain, before any work (ToolScaleError on the first problem);
    returns the domains `domains_dir` has."""
    if not domains_dir.is_dir():
        raise ToolScaleError(f"--toolscale-domains {domains_dir}: not a folder; pass the folder of domain folders "
                             "(<domain>/db.json, policy.md[, tools.py]), e.g. ../shared/benchmarks/toolscale/domains")
    known = available_domains(domains_dir)
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ToolScaleError(f"--toolscale {source}: record #{i} is a {type(rec).__name__}, not an object; {SHAPE}")
        check_record(rec, i, source)
        name = rec["user_scenario"]["instructions"]["domain"]
        if name not in known and not skip_unknown_domains:
            raise ToolScaleError(
                f"--toolscale {source}: record {record_id(rec, i)}: unknown domain {name!r}: {domains_dir} has "
                f"{known or 'no domain folders'}; add {domains_dir / name}/ (db.json, policy.md, tools.py) or pass "
                "--skip-unknown-domains to count and skip such records")
    return known


def convert(records: list[dict], source: str, domains_dir: Path, out: Path, eval_sets: dict[str, set[str]],
            skip_unknown_domains: bool = False, progress: Callable[[int], None] | None = None,
            upstream: Path | None = None) -> Conversion:
    """Check every record (shape errors raise), build each domain's folder once under
    `out/domains/<domain>/` (on the checkout `upstream`'s tools where it has the domain), and keep
    the records whose gold actions replay and that are in no evaluation set.  Writes each
    domain's tasks.json."""
    known = check_records(records, source, domains_dir, skip_unknown_domains)
    conv = Conversion(upstream=upstream)
    seen: set[tuple[str, str]] = set()
    for i, rec in enumerate(records):
        name = rec["user_scenario"]["instructions"]["domain"]
        rid = record_id(rec, i)
        tally = conv.tallies.setdefault(name, Tally())
        tally.generated += 1
        reason, task = _verdict(conv, rec, rid, name, seen, known, domains_dir, out, eval_sets)
        if reason:
            conv.reject(name, reason, rid)
        else:
            tally.kept += 1
            conv.tasks.setdefault(name, []).append(task)
        seen.add((name, rid))
        if progress:
            progress(1)
    for name, tasks in conv.tasks.items():
        atomic_write(conv.envs[name].path / "tasks.json", dump_json(tasks))
    return conv


def _verdict(conv: Conversion, rec: dict, rid: str, name: str, seen: set, known: list[str], domains_dir: Path,
             out: Path, eval_sets: dict[str, set[str]]) -> tuple[str | None, dict | None]:
    """(why the record is rejected, None) or (None, its tau2 task)."""
    if name not in known:
        return "unknown domain (no folder in --toolscale-domains)", None
    if (name, rid) in seen:
        return "duplicate record id", None
    if rec.get("initial_state"):   # tau2 would apply it before the agent; our replay starts from db.json
        return "initial_state is set (replay starts from db.json as is; the release has none)", None
    instr = rec["user_scenario"]["instructions"]
    hit = task_overlap([instr["reason_for_call"], instr["task_instructions"]], eval_sets)
    if hit:   # the set's name unquoted: the summary groups reasons with their quoted parts blanked
        return f"in evaluation set {hit}", None
    env = conv.envs.get(name)
    if env is None:
        try:
            env = conv.envs[name] = prepare_domain(domains_dir / name, out / "domains" / name, conv.upstream)
        except UpstreamError as exc:
            raise ToolScaleError(str(exc)) from None
        except SchemaError as exc:
            raise ToolScaleError(f"--toolscale-domains {domains_dir / name}: {exc}") from None
    task = to_task(rec)
    actions = [{"name": a["name"], "arguments": a["arguments"]} for a in task["evaluation_criteria"]["actions"]]
    reason = replay_verdict(env.domain, task, actions)
    runs = conv.runs.setdefault(name, Counter())
    runs[env.kind] += reason is None
    if env.generic is not None:
        runs["generic"] += replay_verdict(env.generic, task, actions) is None
    return reason, None if reason else task


def replay_verdict(domain: Domain | UpstreamDomain, task: dict, actions: list[dict]) -> str | None:
    """Why `task` cannot run on `domain`'s toolkit (its shape against the tool names, then its gold
    actions replayed on a fresh database), or None."""
    kinds = domain.tool_types
    write = any(kinds.get(a["name"]) == "write" for a in actions)
    return task_shape_reason(task, set(kinds)) or replay_reason(domain.call, domain.db, domain.fresh_db, actions, write)


# ------------------------------------------------------------------------------------------ --list
def list_upstream(checkout: Path, domains_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """(lines to print, error lines): each domain of the checkout with its number of tools, every
    domain tried (one that fails to load is an error line, the others still listed)."""
    lines, errors, total = [], [], 0
    names = checkout_domains(checkout)
    for name in names:
        try:
            dom = load_upstream_domain(checkout, name, domains_dir / name if domains_dir else None)
        except UpstreamError as exc:
            errors.append(str(exc))
            continue
        kinds = Counter(dom.tool_types.values())
        total += len(dom.tool_types)
        split = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        lines.append(f"{name:<14} {len(dom.tool_types):>3} tools ({split})  {dom.tools_class.__name__} over "
                     f"{dom.db_class.__name__} from {dom.db_path}")
    head = f"{len(names) - len(errors)} ToolScale domains, {total} tools, upstream's code in {checkout}"
    skipped = skipped_domains(checkout)
    tail = [f"left out: {', '.join(skipped)} (tau2's own domains: the installed tau2 package runs them)"] if skipped else []
    return [head, *lines, *tail], errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_synthesis.toolscale",
                                description="ToolScale domains on upstream's own tau2 tools, imported from a "
                                            "ToolOrchestra checkout (docs/data_synthesis.md). Converting records: "
                                            "python -m data_synthesis.dataset --toolscale ... --toolscale-upstream ...")
    p.add_argument("--toolscale-upstream", required=True, metavar="CHECKOUT",
                   help="a ToolOrchestra checkout (training/rollout/tau2/domains/<domain>/, data/tau2/domains/<domain>/)")
    p.add_argument("--toolscale-domains", default=None, metavar="DIR",
                   help="the domains' db.json and policy.md, <domain>/ each (default: CHECKOUT/data/tau2/domains)")
    p.add_argument("--list", action="store_true", help="load every domain and print it with its number of tools")
    args = p.parse_args(argv)
    if not args.list:
        p.error("nothing to do: pass --list")
    checkout = Path(args.toolscale_upstream)
    domains_dir = Path(args.toolscale_domains) if args.toolscale_domains else None
    if domains_dir is not None and not domains_dir.is_dir():
        print(f"error: --toolscale-domains {domains_dir}: not a folder", file=sys.stderr)
        return 1
    try:
        lines, errors = list_upstream(checkout, domains_dir)
    except UpstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
