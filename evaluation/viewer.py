"""A single static HTML trajectory viewer for one run (no server, no network).

The records are embedded as JSON; a little script lists the tasks (filter: all / correct /
incorrect / error) and shows, per task, the prediction, the verdict and every turn's
reasoning, tool, alias, expert model, what the tool returned (documents, code and its
output), tokens, dollars and seconds.  All text goes through `textContent`, so nothing in
a model's output can run as HTML.  `viewer.html#filter=incorrect&task=<id>` opens a view.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

MAX_FIELD_CHARS = 20_000   # a long document list is cut in the viewer, never in results.jsonl

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }
#side { width: 340px; overflow-y: auto; border-right: 1px solid #ccc; padding: 8px; }
#main { flex: 1; overflow-y: auto; padding: 12px 20px; }
.task { padding: 4px 6px; cursor: pointer; border-radius: 4px; margin: 2px 0; }
.task:hover { background: #eef; }
.correct { border-left: 5px solid #2a2; } .incorrect { border-left: 5px solid #c22; }
.error { border-left: 5px solid #e90; }
.turn { border: 1px solid #ddd; border-radius: 6px; padding: 8px; margin: 10px 0; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: 6px; max-height: 400px; overflow-y: auto; }
.meta { color: #555; }
</style></head>
<body>
<div id="side">
  <h3 id="title"></h3>
  <label>show <select id="filter">
    <option value="all">all</option><option value="correct">correct</option>
    <option value="incorrect">incorrect</option><option value="error">error</option>
  </select></label>
  <div id="count" class="meta"></div>
  <div id="list"></div>
</div>
<div id="main"><p class="meta">Pick a task on the left.</p></div>
<script id="data" type="application/json">__DATA__</script>
<script>
const RUN = JSON.parse(document.getElementById("data").textContent);
const $ = (tag, text, cls) => { const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text); if (cls) e.className = cls; return e; };
const kind = r => r.status === "error" ? "error" : (r.correct ? "correct" : "incorrect");
const money = d => "$" + Number(d || 0).toFixed(6);
document.getElementById("title").textContent = RUN.label;
function show(r) {
  const m = document.getElementById("main"); m.replaceChildren();
  m.append($("h2", r.id), $("p", "status: " + kind(r), "meta"));
  if (r.question) { m.append($("h4", "Question"), $("pre", r.question)); }
  if (r.reference !== undefined) { m.append($("h4", "Reference"), $("pre", r.reference)); }
  m.append($("h4", "Prediction"), $("pre", r.prediction ?? ""));
  if (r.verdict) m.append($("p", "verdict: " + r.verdict.rule + (r.verdict.raw ? " — judge said: " + r.verdict.raw : ""), "meta"));
  if (r.error) m.append($("h4", "Error"), $("pre", r.error + "\\n" + (r.traceback || "")));
  m.append($("p", "cost " + money(r.cost) + " · tool latency " + Number(r.latency || 0).toFixed(1) +
           " s · wall " + Number(r.wall_s || 0).toFixed(1) + " s · stop: " + (r.stop_reason || ""), "meta"));
  (r.turns || []).forEach(t => {
    const d = $("div", null, "turn");
    d.append($("b", "Turn " + t.index + ": " + (t.tool || "(no valid call)") + (t.alias ? " → " + t.alias : "") +
                    (t.model ? " (" + t.model + ")" : "")));
    if (t.invalid_reason) d.append($("p", "invalid: " + t.invalid_reason, "meta"));
    if (t.reasoning) { d.append($("div", "reasoning", "meta"), $("pre", t.reasoning)); }
    if (t.output) { d.append($("div", "tool output (documents / code and output / answer)", "meta"), $("pre", t.output)); }
    if (t.error) d.append($("p", "tool error: " + t.error, "meta"));
    d.append($("p", "cost " + money(t.cost) + " · " + Number(t.latency || 0).toFixed(2) + " s", "meta"));
    m.append(d);
  });
}
function render() {
  const f = document.getElementById("filter").value, list = document.getElementById("list");
  list.replaceChildren();
  const shown = RUN.records.filter(r => f === "all" || kind(r) === f);
  document.getElementById("count").textContent = shown.length + " of " + RUN.records.length + " tasks";
  shown.forEach(r => { const e = $("div", r.id, "task " + kind(r)); e.dataset.id = r.id;
    e.onclick = () => show(r); list.append(e); });
}
document.getElementById("filter").onchange = render;
// A link can open a view: viewer.html#filter=incorrect&task=<id>
const params = new URLSearchParams(location.hash.slice(1));
if (["all", "correct", "incorrect", "error"].includes(params.get("filter")))
  document.getElementById("filter").value = params.get("filter");
render();
const linked = RUN.records.find(r => r.id === params.get("task"));
if (linked) show(linked);
</script></body></html>
"""


def _clip(value):
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + f"\n... [{len(value) - MAX_FIELD_CHARS} more characters]"
    return value


def _slim(record: dict) -> dict:
    """The fields the viewer shows; the bulky tau2 simulation dump is left out."""
    keep = {k: _clip(v) for k, v in record.items() if k not in ("simulation",)}
    keep["turns"] = [{k: _clip(v) for k, v in t.items()} for t in record.get("turns") or []]
    return keep


def write_viewer(path: str | Path, label: str, records: list[dict]) -> Path:
    """Write the viewer for `records` (last record per id wins) atomically to `path`."""
    by_id = {r["id"]: r for r in records}
    data = json.dumps({"label": label, "records": [_slim(r) for r in by_id.values()]}, ensure_ascii=False)
    # Inside <script>, "</script" or "<!--" in a model's text would end the block early;
    # "<" only occurs inside JSON strings, where \u003c is the same character.
    data = data.replace("<", "\\u003c")
    title = label.replace("&", "&amp;").replace("<", "&lt;")
    html = _PAGE.replace("__TITLE__", title).replace("__DATA__", data)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path
