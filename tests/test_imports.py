"""The import rules docs/architecture.md states, checked on the source (every `import`, also those
inside functions): the core (`orchestrator/`) imports none of data_synthesis/, training/,
evaluation/; and no two modules import each other, directly or through others (no cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "training", "evaluation", "data_synthesis", "retrieval")
FORBIDDEN = {"orchestrator": ("data_synthesis", "training", "evaluation")}
# Entry points in the core's namespace that run the applications' code (the server runs evaluation's
# set-up and loop), each a module or a package with its modules: exempt from FORBIDDEN, and no
# module outside one may import it, so the core still needs none.
ENTRY_POINTS = {"orchestrator.serve"}


def entry_point(module: str) -> str | None:
    """The entry point `module` belongs to (itself, or the package it lies in), else None."""
    return next((e for e in ENTRY_POINTS if module == e or module.startswith(e + ".")), None)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the repository modules it imports}, for every .py file of the packages."""
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "LLM_CALL.py"]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)
        # a name imported from a package counts as that module when it is one, else as the package
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_package_inits(graph):
    """A package's __init__ re-exporting its modules is not a cycle with them: drop edges from a
    module to the packages that contain it."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def test_the_core_imports_no_application_package():
    graph = import_graph()
    bad = [f"{m} imports {t}" for m, ts in graph.items() for t in ts if entry_point(m) is None
           for pkg, banned in FORBIDDEN.items() if m.split(".")[0] == pkg and t.split(".")[0] in banned]
    assert not bad, "forbidden imports (docs/architecture.md, import rules):\n" + "\n".join(sorted(bad))


def test_nothing_imports_an_entry_point():
    graph = import_graph()
    assert ENTRY_POINTS <= set(graph), f"entry points not found: {sorted(ENTRY_POINTS - set(graph))}"
    bad = [f"{m} imports {t}" for m, ts in graph.items() for t in ts
           if entry_point(t) is not None and entry_point(t) != entry_point(m)]
    assert not bad, "entry points are imported by nothing (docs/architecture.md):\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    found = cycles(_without_package_inits(import_graph()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_catch_a_cycle_and_a_forbidden_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # the server package's modules are its entry point; a core module of a similar name is not
    assert [entry_point(m) for m in ("orchestrator.serve", "orchestrator.serve.app", "orchestrator.serve_experts",
                                     "orchestrator.serving")] == ["orchestrator.serve", "orchestrator.serve", None, None]


def test_one_generation_stack_for_training_and_the_gateway():
    """The gateway's transformers backend generates through orchestrator/engines (the engine and
    batcher training samples with)."""
    graph = import_graph()
    backend = graph["orchestrator.gateway.backends.transformers_backend"]
    assert {"orchestrator.engines.hf", "orchestrator.engines.batcher"} <= backend
    own = [str(p.relative_to(ROOT)) for p in (ROOT / "orchestrator").rglob("*.py")
           if "engines" not in p.parts and "model.generate(" in p.read_text()]
    assert not own, f"generation outside orchestrator/engines (transformers' generate): {own}"
