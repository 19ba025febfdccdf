"""Rules read from a domain's own `policy.md`, where it states them plainly, and the tasks that break them.

Offline synthesis cannot understand a policy, but some rules are written in a fixed shape
that names a record type, one of its status-like fields' values, and "must":

- required values of new records:  "New prescriptions must be active", "a new order must be
  created with status pending"  -> a create action on that collection must set the value;
- required state before a write:   "The sale must be pending.", "Both accounts must be
  active.", "Only shows with status scheduled can be booked."  -> an update / delete of a
  record of that collection needs its current value to be one of those the policy names
  (several sentences about one field add up: "pending" for one action, "delivered" for
  another, so a write on a "cancelled" sale breaks the policy whatever the action);
- identification: "authenticate the user ... via their email ... even if the user already
  provides an id"  -> a task that writes, or reads a person's record, must find the user
  (by one of those fields) first, so such tasks where the user names a record by id without
  authenticating are out; public records may still be read by id.

A rule names a collection by its entity or collection name (singular or plural) and a value
only when the value is one of an enum field's values in the schema, so free prose does not
produce rules.  What is not parsed is not enforced: with an LLM the whole policy is given to
the task writer instead.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from data_synthesis import toolkit_runtime as rt
from data_synthesis.schema import Schema

_MUST = re.compile(r"\b(must|should|required|requires|can only|only)\b", re.IGNORECASE)
_AUTH = re.compile(r"\b(authenticat\w*|identif\w*|verify the user|locat\w+ their)\b", re.IGNORECASE)
_EVEN_IF_ID = re.compile(r"even (if|when) the user (already )?provides", re.IGNORECASE)


_GENERIC = {"yes", "no", "none", "true", "false", "other", "unknown", "n/a"}   # words, not states


def _required(sentence: str, value: str) -> bool:
    """`value` is what the sentence requires: "must be <value>", "with status <value>", "status is <value>"."""
    v = rf"(?<![\w-]){re.escape(value.lower())}(?![\w-])"
    return any(re.search(p, sentence) for p in (
        rf"\b(must|should)\s+(be|have|remain)\b[^.;:]*?{v}",
        rf"\bwith\s+(a\s+)?(status|state)\s+(of\s+|in\s+)?{v}",
        rf"\b(status|state)\s+(must\s+be\s+|is\s+|=\s*|in\s+){v}",
        rf"\bonly\b[^.;:]*?\b(status|state)\b[^.;:]*?{v}"))


@dataclass
class PolicyRules:
    create: dict[tuple[str, str], set[str]] = field(default_factory=dict)     # (collection, field) -> values
    before_write: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    identify_by: set[str] = field(default_factory=set)   # lookup fields the policy names for authentication
    must_authenticate: bool = False
    sentences: list[str] = field(default_factory=list)   # the sentences the rules came from

    def __bool__(self) -> bool:
        return bool(self.create or self.before_write or self.identify_by or self.must_authenticate)

    def describe(self) -> list[str]:
        out = [f"new {c}: {f} in {sorted(v)}" for (c, f), v in sorted(self.create.items())]
        out += [f"write on {c}: {f} in {sorted(v)}" for (c, f), v in sorted(self.before_write.items())]
        if self.must_authenticate:
            out.append("the user is authenticated first" + (f" by {sorted(self.identify_by)}" if self.identify_by else ""))
        return out


def _names(cname: str, entity: str) -> list[str]:
    words = {cname, entity, cname.rstrip("s"), entity + "s", entity + "es"}
    words |= {w.replace("_", " ") for w in words}
    return sorted((w for w in words if w), key=len, reverse=True)


def _sentences(text: str) -> list[str]:
    """Sentences of markdown text: bullets and paragraphs, with wrapped lines joined."""
    items: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        starts = not line or re.match(r"^([-*#>]|\d+[.)])", line)
        if items and items[-1] and not starts:
            items[-1] += " " + line
        else:
            items.append(line.lstrip("-*#> ").strip())
    out = []
    for item in items:
        out += [s.strip() for s in re.split(r"(?<=[.;])\s+", item) if s.strip()]
    return out


def parse_policy(text: str, schema: Schema) -> PolicyRules:
    """The rules of `text` (a policy.md) that are stated plainly; see the module docstring."""
    rules = PolicyRules()
    enums = {(c, f): {str(v) for v in spec.values or []} for c, coll in schema.collections.items()
             for f, spec in coll.fields.items() if spec.type == "enum" and spec.values}
    lookups = {f.split(".")[-1] for coll in schema.collections.values() for f in coll.lookup_fields}
    lookups |= {"email", "phone", "name", "zip", "postal code"}
    for sentence in _sentences(text):
        low = sentence.lower()
        if _AUTH.search(low) and ("must" in low or "at the beginning" in low):
            rules.must_authenticate = True
            rules.identify_by |= {f for f in lookups if re.search(rf"\b{re.escape(f.replace('_', ' '))}\b",
                                                                  low.replace("_", " "))}
            rules.sentences.append(sentence)
            continue
        if _EVEN_IF_ID.search(low):
            rules.must_authenticate = True
        if not _MUST.search(low):
            continue
        for cname, coll in schema.collections.items():
            named = next((n for n in _names(cname, coll.entity) if re.search(rf"\b{re.escape(n)}\b", low)), None)
            if named is None:
                continue
            for (c, fname), values in enums.items():
                if c != cname:
                    continue
                said = {v for v in values if v.lower() not in _GENERIC and _required(low, v)}
                if not said:
                    continue
                is_new = re.search(rf"\bnew(ly)?\s+(\w+\s+)?{re.escape(named)}\b", low) or "created with" in low
                target = rules.create if is_new else rules.before_write
                target.setdefault((cname, fname), set()).update(said)
                rules.sentences.append(sentence)
    return rules


class PolicyCheck:
    """Why a task breaks the parsed rules (None when it does not); works on gold actions.

    `tools` are the generated ToolDefs (their op / collection / field say what an action does).
    """

    def __init__(self, rules: PolicyRules, schema: Schema, tools: list, db: dict):
        self.rules, self.schema, self.db = rules, schema, db
        self.tools = {t.name: t for t in tools}

    def reason(self, task: dict) -> str | None:
        actions = (task.get("evaluation_criteria") or {}).get("actions") or []
        tools = [self.tools.get(a["name"]) for a in actions]
        people = {c for c, coll in self.schema.collections.items() if coll.lookup_fields}
        personal = people | {c for c, coll in self.schema.collections.items()
                             if any(f.type == "ref" and f.collection in people for f in coll.fields.values())}
        # a write, or a read of a person's record or of a record that belongs to a person (a prescription),
        # needs the user found first; public records (a game's score, a show's time) may be read without
        needs_auth = any(t is not None and (t.kind == "write" or t.collection in personal) for t in tools)
        if self.rules.must_authenticate and needs_auth:
            first_write = next((i for i, t in enumerate(tools) if t is not None and t.kind == "write"), len(tools))
            finds = [t for t in tools[:first_write + 1] if t is not None and t.op == "find"]
            if not finds:
                return "policy.md: the user is not authenticated first"
            if finds and self.rules.identify_by and not any(
                    w.replace(" ", "_") in t.field.split(".")[-1] for t in finds for w in self.rules.identify_by):
                return f"policy.md: the user is identified by {finds[0].field}, not {sorted(self.rules.identify_by)}"
        for action, tool in zip(actions, tools):
            if tool is None or tool.collection is None:
                continue
            cname, args = tool.collection, action.get("arguments") or {}
            if tool.op == "create":
                for (c, fname), allowed in self.rules.create.items():
                    if c == cname and fname in args and str(args[fname]) not in allowed:
                        return f"policy.md: a new {self.schema.collections[cname].entity} must have {fname} in {sorted(allowed)}"
            elif tool.op in ("update", "delete"):
                coll = self.schema.collections[cname]
                rid = args.get(coll.id_field or f"{coll.entity}_id")
                record = self.db.get(cname, {}).get(rid) if rid is not None else None
                for (c, fname), allowed in self.rules.before_write.items():
                    if c != cname or record is None:
                        continue
                    current = rt._at(record, fname)
                    if current is not None and str(current) not in allowed:
                        return (f"policy.md: a write on a {self.schema.collections[cname].entity} needs {fname} "
                                f"in {sorted(allowed)}")
        return None
