"""Offline task templates: user intents over a domain's generic toolkit, and evolution.

A template samples a user (a record of a collection with a lookup field, e.g. a
student found by email) and rows linked to them, then writes a `Draft`: the gold
actions, what the user knows and wants, what the agent must say.  `evolve` makes a
draft harder: `chain` adds another change for the same user (more steps, linked
records), `conditional` makes the new value depend on the record's current state
(more constraints).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from data_synthesis.fake import RecordFaker
from data_synthesis.schema import FieldSpec, Schema
from data_synthesis.toolgen import ToolDef, create_params, id_param, label_paths
from data_synthesis import toolkit_runtime as rt

_SCALAR = ("string", "text", "enum", "integer", "number", "boolean", "date", "datetime")
CONFIRM = "When the agent lists a change and asks you to confirm, answer yes."


@dataclass
class Draft:
    """A task before it becomes a tau2 Task: gold actions plus what the user knows and wants."""

    template: str
    kind: str                                  # "read" | "write"
    actions: list[dict]                        # [{"name", "arguments"}]
    user: str                                  # "collection id" of the caller
    persona: str                               # "Jane Doe" (may be "")
    known_info: str
    unknown_info: str
    wants: list[str]                           # one sentence per request
    communicate_info: list[str] = field(default_factory=list)
    nl_assertions: list[str] = field(default_factory=list)
    evolved: list[str] = field(default_factory=list)
    task_instructions: str = ""                # how the simulated user behaves ("" = the default)
    source: str = "offline"                    # "offline" templates or "llm"


def _fmt(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class TaskFactory:
    """Samples drafts for one domain; deterministic given its `rng` seed."""

    def __init__(self, schema: Schema, tools: list[ToolDef], db: dict, seed: int):
        self.schema, self.db, self.rng = schema, db, random.Random(seed)
        self.faker = RecordFaker(schema, seed)
        self.faker.ids = {c: sorted(recs) for c, recs in db.items()}
        self.sdict = schema.model_dump()
        self.by_op: dict[tuple, ToolDef] = {(t.op, t.collection, t.field): t for t in tools}
        self.kinds = {t.name: t.kind for t in tools}
        self.users = {c: self._unique_users(c, coll.lookup_fields[0]) for c, coll in schema.collections.items()
                      if coll.lookup_fields and ("find", c, coll.lookup_fields[0]) in self.by_op}
        self.users = {c: ids for c, ids in self.users.items() if ids}
        # Domains without a lookup field (no one to authenticate) get only the by-id intents.
        self.templates = {"read_record": self.read_record, "update_record": self.update_record}
        if self.users:
            self.templates.update({"read_own": self.read_own, "update_own": self.update_own,
                                   "read_linked": self.read_linked, "update_linked": self.update_linked,
                                   "create_linked": self.create_linked, "delete_linked": self.delete_linked})

    def _unique_users(self, cname: str, path: str) -> list[str]:
        seen: dict[str, list[str]] = {}
        for rid, rec in sorted(self.db[cname].items()):
            value = rt._at(rec, path)
            if value not in (None, ""):
                seen.setdefault(str(value).strip().lower(), []).append(rid)
        return sorted(ids[0] for ids in seen.values() if len(ids) == 1)

    # ---- pieces ---------------------------------------------------------------------
    def sample_user(self) -> tuple[str, str] | None:
        if not self.users:
            return None
        cname = self.rng.choice(sorted(self.users))
        return cname, self.rng.choice(self.users[cname])

    def _identify(self, cname: str, rid: str) -> tuple[list[dict], str, str, str]:
        coll = self.schema.collections[cname]
        path = coll.lookup_fields[0]
        value = rt._at(self.db[cname][rid], path)
        find = self.by_op[("find", cname, path)]
        persona = rt.label_of(self.db[cname][rid], _name_paths(coll))
        known = (f"You are {persona}. " if persona else "") + f"Your {path.split('.')[-1].replace('_', ' ')} is {value}."
        unknown = f"You do not know your {coll.entity} id."
        return [_act(find, {find.params[0].name: value})], persona, known, unknown

    def linked_records(self, cname: str, rid: str) -> list[tuple[str, str, str]]:
        """(child collection, ref field, child id) of records linked to the user."""
        out = []
        for child, coll in self.schema.collections.items():
            for fname, spec in coll.fields.items():
                if spec.type == "ref" and spec.collection == cname and ("list_by", child, fname) in self.by_op:
                    out += [(child, fname, cid) for cid, rec in sorted(self.db[child].items()) if rec.get(fname) == rid]
        return out

    def new_value(self, spec: FieldSpec, current: object, name: str) -> object | None:
        """A valid value for field `spec` that differs from `current` (None if there is none)."""
        rng = self.rng
        if spec.type == "enum":
            options = [v for v in spec.values if v != current]
        elif spec.type == "boolean":
            options = [not current] if isinstance(current, bool) else [True, False]
        elif spec.type == "ref":
            options = [i for i in self.faker.ids[spec.collection] if i != current][:50]
        elif spec.type == "integer" and spec.min is not None and spec.max is not None:
            options = [v for v in range(int(spec.min), int(spec.max) + 1) if v != current][:100]
        else:
            options = [v for v in (self.faker.value(name, spec, "new." + name, {}) for _ in range(3))
                       if v is not None and v != current]
        return rng.choice(options) if options else None

    # ---- templates ------------------------------------------------------------------
    def _scalar_fields(self, cname: str, rid: str) -> list[str]:
        coll = self.schema.collections[cname]
        rec = self.db[cname][rid]
        return [f for f, s in coll.fields.items() if s.type in _SCALAR and rec.get(f) not in (None, "")
                and f != coll.id_field and f not in coll.lookup_fields]

    def any_record(self, writable: bool = False) -> tuple[str, str] | None:
        """A random (collection, id); with `writable`, only from collections with update tools."""
        updatable = {t.collection for t in self.by_op.values() if t.op == "update"}
        names = sorted(c for c in self.schema.collections if self.db.get(c) and (not writable or c in updatable))
        if not names:
            return None
        cname = self.rng.choice(names)
        return cname, self.rng.choice(sorted(self.db[cname]))

    def read_record(self) -> Draft | None:
        """A question about one record the user names by id (no authentication step)."""
        pick = self.any_record()
        if pick is None or not self._scalar_fields(*pick):
            return None
        cname, rid = pick
        coll = self.schema.collections[cname]
        fname = self.rng.choice(self._scalar_fields(cname, rid))
        value = _fmt(self.db[cname][rid][fname])
        acts = [_act(self.by_op[("get", cname, None)], {id_param(cname, coll): rid})]
        return Draft("read_record", "read", acts, f"{cname} {rid}", "", f"The {coll.entity} id is {rid}.", "",
                     [f"You want to know the {_words(fname)} of {coll.entity} {rid}."], communicate_info=[value],
                     nl_assertions=[f"The agent says the {_words(fname)} of {coll.entity} {rid} is {value}."])

    def update_record(self) -> Draft | None:
        """A change to one record the user names by id."""
        pick = self.any_record(writable=True)
        if pick is None:
            return None
        cname, rid = pick
        change = self._update(cname, rid, own=False)
        if change is None:
            return None
        coll = self.schema.collections[cname]
        acts = [_act(self.by_op[("get", cname, None)], {id_param(cname, coll): rid}), change[0]]
        return Draft("update_record", "write", acts, f"{cname} {rid}", "", f"The {coll.entity} id is {rid}.", "",
                     [change[1].replace(f"of your {coll.entity}", f"of {coll.entity}")], nl_assertions=[change[2]])

    def read_own(self) -> Draft | None:
        user = self.sample_user()
        if user is None:
            return None
        cname, rid = user
        coll = self.schema.collections[cname]
        rec = self.db[cname][rid]
        fields = self._scalar_fields(cname, rid)
        if not fields:
            return None
        fname = self.rng.choice(fields)
        acts, persona, known, unknown = self._identify(cname, rid)
        acts.append(_act(self.by_op[("get", cname, None)], {id_param(cname, coll): rid}))
        return Draft("read_own", "read", acts, f"{cname} {rid}", persona, known, unknown,
                     [f"You want to know the {_words(fname)} on your {coll.entity} record."],
                     communicate_info=[_fmt(rec[fname])],
                     nl_assertions=[f"The agent tells the user that their {_words(fname)} is {_fmt(rec[fname])}."])

    def _update(self, cname: str, rid: str, own: bool) -> tuple[dict, str, str] | None:
        coll = self.schema.collections[cname]
        ups = [t for t in self.by_op.values() if t.op == "update" and t.collection == cname]
        self.rng.shuffle(ups)
        for tool in ups:
            value = self.new_value(coll.fields[tool.field], self.db[cname][rid].get(tool.field), tool.field)
            if value is not None:
                what = f"on your {coll.entity} record" if own else f"of your {coll.entity} {rid}"
                args = {id_param(cname, coll): rid, tool.params[1].name: value}
                return (_act(tool, args), f"You want the {_words(tool.field)} {what} changed to {_fmt(value)}.",
                        f"The agent changes the {_words(tool.field)} of {coll.entity} {rid} to {_fmt(value)}.")
        return None

    def update_own(self) -> Draft | None:
        user = self.sample_user()
        if user is None:
            return None
        cname, rid = user
        change = self._update(cname, rid, own=True)
        if change is None:
            return None
        acts, persona, known, unknown = self._identify(cname, rid)
        coll = self.schema.collections[cname]
        acts += [_act(self.by_op[("get", cname, None)], {id_param(cname, coll): rid}), change[0]]
        return Draft("update_own", "write", acts, f"{cname} {rid}", persona, known, unknown, [change[1]],
                     nl_assertions=[change[2]])

    def _linked(self) -> tuple[str, str, str, str, str] | None:
        user = self.sample_user()
        if user is None:
            return None
        children = self.linked_records(*user)
        if not children:
            return None
        return (*user, *self.rng.choice(children))

    def _linked_start(self, cname, rid, child, fname) -> tuple[list[dict], str, str, str]:
        acts, persona, known, unknown = self._identify(cname, rid)
        acts.append(_act(self.by_op[("list_by", child, fname)], {fname: rid}))
        return acts, persona, known, unknown

    def read_linked(self) -> Draft | None:
        pick = self._linked()
        if pick is None:
            return None
        cname, rid, child, fname, cid = pick
        coll = self.schema.collections[child]
        rec = self.db[child][cid]
        fields = [f for f, s in coll.fields.items() if s.type in _SCALAR and rec.get(f) not in (None, "")]
        if not fields:
            return None
        target = self.rng.choice(fields)
        acts, persona, known, unknown = self._linked_start(cname, rid, child, fname)
        acts.append(_act(self.by_op[("get", child, None)], {id_param(child, coll): cid}))
        return Draft("read_linked", "read", acts, f"{cname} {rid}", persona, known, unknown,
                     [f"You want to know the {_words(target)} of your {coll.entity} {cid}."],
                     communicate_info=[_fmt(rec[target])],
                     nl_assertions=[f"The agent tells the user the {_words(target)} of {coll.entity} {cid} "
                                    f"is {_fmt(rec[target])}."])

    def update_linked(self) -> Draft | None:
        pick = self._linked()
        if pick is None:
            return None
        cname, rid, child, fname, cid = pick
        change = self._update(child, cid, own=False)
        if change is None:
            return None
        acts, persona, known, unknown = self._linked_start(cname, rid, child, fname)
        coll = self.schema.collections[child]
        acts += [_act(self.by_op[("get", child, None)], {id_param(child, coll): cid}), change[0]]
        return Draft("update_linked", "write", acts, f"{cname} {rid}", persona, known, unknown, [change[1]],
                     nl_assertions=[change[2]])

    def create_linked(self) -> Draft | None:
        user = self.sample_user()
        if user is None:
            return None
        cname, rid = user
        options = [(t, f) for t in self.by_op.values() if t.op == "create"
                   for f, s in create_params(self.schema.collections[t.collection])
                   if s.type == "ref" and s.collection == cname]
        if not options:
            return None
        tool, fname = self.rng.choice(options)
        coll = self.schema.collections[tool.collection]
        args = {}
        for name, spec in create_params(coll):
            if name == fname:
                args[name] = rid
            elif not spec.optional:
                args[name] = self.new_value(spec, None, name)
        if any(v is None for v in args.values()):
            return None
        acts, persona, known, unknown = self._identify(cname, rid)
        acts.append(_act(tool, args))
        details = ", ".join(f"{_words(k)} {_fmt(v)}" for k, v in args.items() if k != fname)
        return Draft("create_linked", "write", acts, f"{cname} {rid}", persona, known, unknown,
                     [f"You want a new {_words(coll.entity)} for yourself with {details}."],
                     nl_assertions=[f"The agent creates {_a(coll.entity)} for {rid} with {details}."])

    def delete_linked(self) -> Draft | None:
        pick = self._linked()
        if pick is None or ("delete", pick[2], None) not in self.by_op:
            return None
        cname, rid, child, fname, cid = pick
        acts, persona, known, unknown = self._linked_start(cname, rid, child, fname)
        coll = self.schema.collections[child]
        acts += [_act(self.by_op[("get", child, None)], {id_param(child, coll): cid}),
                 _act(self.by_op[("delete", child, None)], {id_param(child, coll): cid})]
        return Draft("delete_linked", "write", acts, f"{cname} {rid}", persona, known, unknown,
                     [f"You want your {coll.entity} {cid} deleted."],
                     nl_assertions=[f"The agent deletes {coll.entity} {cid}."])

    # ---- evolution -----------------------------------------------------------------------
    def evolve(self, draft: Draft) -> Draft | None:
        """A harder variant of `draft` (None when no operator applies)."""
        ops = [self.conditional, self.chain] if draft.kind == "write" else [self.chain]
        self.rng.shuffle(ops)
        for op in ops:
            harder = op(draft)
            if harder is not None:
                return harder
        return None

    def chain(self, draft: Draft) -> Draft | None:
        """Add a second change for the same user, often on a linked record."""
        cname, rid = draft.user.split(" ", 1)
        by_id = draft.template in ("read_record", "update_record")  # the user gave an id, not a lookup
        for _ in range(4):
            name = "update_record" if by_id else self.rng.choice(
                ["update_linked", "update_own", "create_linked", "delete_linked"])
            extra = self.update_record() if by_id else self._for_user(name, cname, rid)
            if extra is None or _same_target(extra.actions[-1], draft.actions, self.kinds):
                continue
            acts = draft.actions + [a for a in extra.actions if a not in draft.actions]
            return Draft(draft.template, "write", acts, draft.user, draft.persona, draft.known_info,
                         draft.unknown_info, draft.wants + ["After that, " + extra.wants[0][0].lower() + extra.wants[0][1:]],
                         draft.communicate_info, draft.nl_assertions + extra.nl_assertions,
                         draft.evolved + [f"chain:{name}"])
        return None

    def _for_user(self, template: str, cname: str, rid: str) -> Draft | None:
        """Run a template with the user fixed to `cname rid`."""
        saved = self.users
        self.users = {cname: [rid]}
        try:
            return self.templates[template]()
        finally:
            self.users = saved

    def conditional(self, draft: Draft) -> Draft | None:
        """Make the last update depend on another field of the same record."""
        last = draft.actions[-1]
        tool = next((t for t in self.by_op.values() if t.name == last["name"] and t.op == "update"), None)
        if tool is None:
            return None
        coll = self.schema.collections[tool.collection]
        rid = last["arguments"][id_param(tool.collection, coll)]
        if any(rid in a["arguments"].values() and self.kinds[a["name"]] == "write" for a in draft.actions[:-1]):
            return None  # an earlier step changed this record: its pristine state is not the one seen
        rec = self.db[tool.collection][rid]
        conds = [f for f, s in coll.fields.items() if s.type in ("enum", "boolean") and f != tool.field
                 and rec.get(f) is not None]
        other = self.new_value(coll.fields[tool.field], rec.get(tool.field), tool.field)
        value = last["arguments"][tool.params[1].name]
        if not conds or other is None or other == value:
            return None
        cond = self.rng.choice(conds)
        holds = self.rng.random() < 0.5
        shown = rec[cond] if holds else self.new_value(coll.fields[cond], rec[cond], cond)
        if shown is None:
            return None
        gold = value if holds else other
        args = dict(last["arguments"], **{tool.params[1].name: gold})
        want = (f"If the {_words(cond)} of {coll.entity} {rid} is {_fmt(shown)}, you want its {_words(tool.field)} "
                f"changed to {_fmt(value)}; otherwise to {_fmt(other)}.")
        return Draft(draft.template, "write", draft.actions[:-1] + [{"name": tool.name, "arguments": args}],
                     draft.user, draft.persona, draft.known_info, draft.unknown_info, draft.wants[:-1] + [want],
                     draft.communicate_info,
                     draft.nl_assertions[:-1] + [f"The agent changes the {_words(tool.field)} of {coll.entity} "
                                                 f"{rid} to {_fmt(gold)}."], draft.evolved + ["conditional"])


def _same_target(action: dict, actions: list[dict], kinds: dict[str, str]) -> bool:
    """True when a write in `actions` already targets the record `action` targets.

    The first argument of update/delete tools is the record id (toolgen's convention).
    """
    first = next(iter(action["arguments"].values()), None)
    return any(kinds.get(a["name"]) == "write" and next(iter(a["arguments"].values()), None) == first
               for a in actions)


def _act(tool: ToolDef, arguments: dict) -> dict:
    return {"name": tool.name, "arguments": arguments}


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + _words(noun)


def _words(name: str) -> str:
    return name.replace("_", " ").replace(".", " ")


def _name_paths(coll) -> list[str]:
    """Label paths that name a person or thing (not refs/enums): the persona's name."""
    paths = label_paths(coll)
    return paths if all(coll.fields.get(p.split(".")[0]) is None or
                        coll.fields[p.split(".")[0]].type in ("string", "object") for p in paths) else []
