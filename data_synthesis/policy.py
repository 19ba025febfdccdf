"""The offline `policy.md`: what the agent may do in a domain, written from its schema and tools.

It follows the shape of the ToolScale policies (authenticate first, act only on the
user's own records, confirm every write, one tool call at a time, transfer rules).
"""
from __future__ import annotations

from data_synthesis.schema import Schema
from data_synthesis.toolgen import ToolDef


def _signature(tool: ToolDef) -> str:
    return f"{tool.name}({', '.join(p.name for p in tool.params)})"


def render_policy(schema: Schema, tools: list[ToolDef]) -> str:
    """Markdown policy text for `schema` with its generated `tools` (deterministic)."""
    title = schema.domain.replace("_", " ")
    users = [(c, coll) for c, coll in schema.collections.items() if coll.lookup_fields]
    lines = [f"# {title.title()} agent policy", ""]
    if schema.description:
        lines += [schema.description.strip(), ""]
    lines += ["## Authentication"]
    if users:
        for cname, coll in users:
            finder = next((t for t in tools if t.op == "find" and t.collection == cname), None)
            how = f"`{_signature(finder)}`" if finder else f"their {coll.lookup_fields[0]}"
            lines.append(f"- A {coll.entity} is identified by their {coll.lookup_fields[0]} with {how}; "
                         "do this before revealing data or acting, even if the user gives an id.")
        lines.append("- If the lookup returns several ids, ask for details that single one out; never guess.")
    else:
        lines.append("- Ask the user for the id of the record they want to act on and check it exists first.")
    lines += ["- Help one user per conversation; deny requests about other people's records.", "",
              "## Records"]
    for cname, coll in schema.collections.items():
        fields = ", ".join(coll.fields)
        lines.append(f"- {cname} ({coll.entity}, id `{coll.id_field or coll.entity + '_id'}`): {fields}.")
    lines += ["", "## Read actions"]
    lines += [f"- `{_signature(t)}`: {t.summary}" for t in tools if t.kind == "read"]
    lines += ["", "## Write actions",
              "Before any write, list the exact change (record id, field, new value) and get an explicit",
              "\"yes\" from the user. Check the record with a read action first.", ""]
    lines += [f"- `{_signature(t)}`: {t.summary}" for t in tools if t.kind == "write"]
    lines += ["", "## Rules",
              "- Use at most one tool call at a time; do not reply to the user in the same turn as a tool call.",
              "- Only change the user's own records, or records linked to them.",
              "- Do not make up information or procedures; report a tool's error message to the user.",
              "- Deny requests the tools cannot do or that break these rules.", "",
              "## Transfer to a human agent",
              "Transfer only if the user asks for a human or the request is in scope but the tools cannot "
              "do it: call `transfer_to_human_agents(summary)`, then say: YOU ARE BEING TRANSFERRED TO A "
              "HUMAN AGENT. PLEASE HOLD ON.", ""]
    return "\n".join(lines)
