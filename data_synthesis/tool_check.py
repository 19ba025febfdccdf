"""Run generated tool code on the database inside the sandbox and report each tool.

The host side (`check_tools`) parses the code with `ast` (never imports it), plans one
call per tool with sample arguments taken from the database, and runs this file as the
sandbox's main.py next to tools.py, db.json and plan.json.  Inside, every tool runs on
a fresh copy of the database; a tool passes when it returns JSON-serialisable data or
raises ValueError (the contract's "clear error"); anything else is a crash.

Output (stdout, one JSON object): {"import_error": str | null,
  "tools": {name: {"status": "ok" | "value_error" | "crash" | "not_listed", "detail": str}}}
"""
import copy
import json
import traceback


def _run_plan():
    """Sandbox side: import tools.py, run plan.json's calls, print the report."""
    report = {"import_error": None, "tools": {}}
    try:
        import tools  # the code under test, next to this file in the sandbox
    except BaseException as exc:  # noqa: BLE001 - any failure to import is the finding
        report["import_error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(report))
        return
    db = json.load(open("db.json"))
    listed = getattr(tools, "TOOL_TYPES", None)
    if not isinstance(listed, dict):
        report["import_error"] = "TOOL_TYPES missing or not a dict"
        print(json.dumps(report))
        return
    for call in json.load(open("plan.json")):
        name = call["name"]
        if name not in listed or not callable(getattr(tools, name, None)):
            report["tools"][name] = {"status": "not_listed", "detail": "not in TOOL_TYPES or not a function"}
            continue
        try:
            out = getattr(tools, name)(copy.deepcopy(db), **call["kwargs"])
            json.dumps(out)
            report["tools"][name] = {"status": "ok", "detail": repr(out)[:200]}
        except ValueError as exc:
            report["tools"][name] = {"status": "value_error", "detail": str(exc)[:200]}
        except BaseException as exc:  # noqa: BLE001 - a crash of any kind fails the tool
            tb = traceback.format_exc().strip().splitlines()[-1]
            report["tools"][name] = {"status": "crash", "detail": f"{type(exc).__name__}: {exc} ({tb})"[:300]}
    print(json.dumps(report))


def plan_calls(source: str, db: dict, id_names: dict) -> list:
    """One call per top-level function whose first parameter is `db`, with sample kwargs.

    id_names maps an argument name ("student_id") to a collection; other names take the
    first value of a same-named field in the database, numbers 1, anything else "test".
    """
    import ast  # lazy: this file also runs alone in the sandbox (check_tools): stdlib only at its top
    tree = ast.parse(source)
    fields = {}
    for records in db.values():
        for rec in list(records.values())[:20]:
            for key, value in rec.items():
                if value is not None and not isinstance(value, (dict, list)):
                    fields.setdefault(key, value)
    calls = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.args.args or node.args.args[0].arg != "db":
            continue
        args = node.args.args[1:]
        n_required = len(args) - len(node.args.defaults)
        kwargs = {}
        for i, arg in enumerate(args):
            if i >= n_required:
                continue  # keep the default
            name = arg.arg
            if name in id_names and db.get(id_names[name]):
                kwargs[name] = sorted(db[id_names[name]])[0]
            elif name in fields:
                kwargs[name] = fields[name]
            elif any(w in name for w in ("amount", "count", "quantity", "number", "limit", "days", "price")):
                kwargs[name] = 1
            else:
                kwargs[name] = "test"
        calls.append({"name": node.name, "kwargs": kwargs})
    return calls


def check_tools(source: str, db: dict, id_names: dict, timeout: float = 60.0) -> dict:
    """Report (see module doc) for tool code `source` on `db`; SyntaxError -> import_error."""
    from pathlib import Path  # lazy: this file also runs alone in the sandbox, importing only json & co.
    try:
        plan = plan_calls(source, db, id_names)
    except SyntaxError as exc:
        return {"import_error": f"SyntaxError: {exc.msg} (line {exc.lineno})", "tools": {}}
    from orchestrator.sandbox import SandboxUnavailable, run_python  # lazy: not in the sandboxed copy of this file
    files = {"tools.py": source, "db.json": json.dumps(db), "plan.json": json.dumps(plan)}
    try:
        result = run_python(Path(__file__).read_text() + "\n\nif __name__ == '__main__':\n    _run_plan()\n",
                            timeout=timeout, files=files)
    except SandboxUnavailable as exc:
        return {"import_error": f"sandbox unavailable: {exc}", "tools": {}}
    if result.timed_out:
        return {"import_error": f"timed out after {timeout:g} s (a tool loops or is too slow)", "tools": {}}
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"import_error": f"no report (exit {result.exit_code}): {result.stderr.strip()[-300:]}", "tools": {}}
