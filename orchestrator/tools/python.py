"""Kind `python`: a Python function is the tool.

    {"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"}

The argument schema comes from the function's signature and its Google-style docstring (`Args:`),
or from `parameters` (a JSON schema object) when given.  Sync or async functions; in this
process (a sync one in a worker thread, so its deadline holds), or with `"sandbox": true` inside
orchestrator/sandbox (the module must be one file; it is copied in and imported there, and a run
past `timeout_s` is killed).  The return value must be JSON (str, number, bool, None, list, dict).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, create_model

from orchestrator.tools.registry import CallContext, Function, FunctionKind, ToolFailure, register
from orchestrator.tools.spec import FunctionToolSpec

RESULT_MARK = "\n<<tool-result>>"
SANDBOX_GRACE_S = 10.0      # the sandbox kills the run at timeout_s; its start and clean-up may take this long


class Spec(FunctionToolSpec):
    kind: Literal["python"]
    handler: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                         description="package.module:function")
    parameters: dict[str, Any] | None = Field(None, description="JSON schema of the arguments (default: "
                                                                "from the signature and docstring)")
    sandbox: bool = False


def import_handler(handler: str, tool: str):
    module_name, _, attr = handler.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:   # noqa: BLE001 - any import failure is the user's to fix
        raise ToolFailure(f"handler {handler!r} does not import: {type(exc).__name__}: {exc}",
                          fix=f"check that `python -c \"import {module_name}\"` works from where the run starts "
                              f"(the repository root, or add its folder to PYTHONPATH)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ToolFailure(f"handler {handler!r}: module {module_name!r} has no function {attr!r}",
                          fix=f"define `def {attr}(...)` in {getattr(module, '__file__', module_name)} or fix "
                              f"tools.json's `handler` of tool {tool!r}")
    return module, fn


def signature_schema(fn) -> tuple[str, dict[str, Any], type]:
    """(summary, JSON schema of the arguments, pydantic model validating them) from `fn`'s
    signature and Google-style docstring."""
    from orchestrator.domains.folder import parse_args_doc

    summary, docs = parse_args_doc(fn.__doc__)
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn, eval_str=True).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        ann = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (ann, Field(default, description=docs.get(pname) or None))
    model = create_model(f"{fn.__name__}_arguments", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("required", [])
    return summary, schema, model


@register
class Python(FunctionKind):
    name = "python"
    spec = Spec

    def functions(self, spec: Spec, runtime) -> list[Function]:
        if spec.sandbox and spec.parameters is not None:
            fn = validator = None      # the handler runs only inside the sandbox
            module_file = _module_file(spec)
            summary = ""
        else:
            module, fn = import_handler(spec.handler, spec.name)
            module_file = getattr(module, "__file__", None)
            summary, schema, validator = signature_schema(fn)
        parameters = spec.parameters if spec.parameters is not None else schema
        if spec.parameters is not None:
            validator = None
        description = spec.description or summary or f"the Python function {spec.handler}"
        if spec.sandbox:
            call = _sandboxed(spec, module_file, validator)
            is_async = False
        else:
            call = _in_process(fn, validator)
            is_async = inspect.iscoroutinefunction(fn)
        return [Function(spec.name, description, parameters, spec, call, is_async=is_async,
                         grace_s=SANDBOX_GRACE_S if spec.sandbox else 0.0)]


def _checked(validator, arguments: dict) -> dict:
    if validator is None:
        return arguments
    try:
        return dict(validator.model_validate(arguments))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "arguments"
        raise ToolFailure(f"bad arguments: {where}: {first['msg']}",
                          fix="call it with the arguments its schema lists") from None


def _in_process(fn, validator):
    if inspect.iscoroutinefunction(fn):
        async def call_async(arguments: dict, ctx: CallContext):
            return await fn(**_checked(validator, arguments))
        return call_async

    def call(arguments: dict, ctx: CallContext):
        return fn(**_checked(validator, arguments))
    return call


def _module_file(spec: Spec) -> str:
    module_name = spec.handler.partition(":")[0]
    found = importlib.util.find_spec(module_name)
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise ToolFailure(f"handler {spec.handler!r}: no Python file for module {module_name!r}",
                          fix="a sandboxed handler must be one importable .py file")
    return found.origin


def _sandboxed(spec: Spec, module_file: str | None, validator):
    if not module_file or not module_file.endswith(".py"):
        raise ToolFailure(f"handler {spec.handler!r}: a sandboxed handler must be one .py file, got {module_file!r}",
                          fix="move the function into a single-file module, or drop `\"sandbox\": true`")
    attr = spec.handler.partition(":")[2]

    def call(arguments: dict, ctx: CallContext):
        arguments = _checked(validator, arguments)
        code = (
            "import asyncio, importlib.util, inspect, json, sys\n"
            "spec = importlib.util.spec_from_file_location('tool_handler', 'tool_handler.py')\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\n"
            f"out = getattr(module, {attr!r})(**json.loads({json.dumps(json.dumps(arguments))}))\n"
            "if inspect.isawaitable(out):\n    out = asyncio.run(out)\n"
            f"sys.stdout.write({RESULT_MARK!r} + json.dumps(out))\n")
        files = {"files": {"tool_handler.py": Path(module_file)}}
        if ctx.runtime is not None:
            result = ctx.runtime.run_code(code, ctx.timeout_s, **files)
        else:
            from orchestrator.sandbox import run_python
            result = run_python(code, timeout=ctx.timeout_s, **files)
        if result.timed_out:
            raise ToolFailure(f"the sandboxed handler ran past its deadline ({ctx.timeout_s:g} s) and was killed",
                              fix="make it faster or raise the tool's `timeout_s` in tools.json")
        if result.exit_code != 0 or RESULT_MARK not in result.stdout:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ToolFailure(f"the sandboxed handler failed (exit {result.exit_code}): {tail[0][:300]}",
                              fix="run the handler by hand with these arguments; it must return JSON")
        return json.loads(result.stdout.rsplit(RESULT_MARK, 1)[1])
    return call


