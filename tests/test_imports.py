"""The import rules docs/architecture.md states, checked on the source (every `import`, also those
inside functions, and modules named in strings for importlib): imports only go down the layers of
LAYERS; and no two modules import each other, directly or through others (no cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The one layer list, bottom first: a module may import modules of its own layer and of the layers
# below it, never of one above.  A module belongs to the layer of the longest prefix naming it
# (`orchestrator.serve` is the serving layer, the rest of `orchestrator` the core).
# docs/architecture.md ("Import rules") draws it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("orchestrator.redaction", "orchestrator.ports")),   # stdlib-only helpers every layer needs
    ("retrieval", ("retrieval",)),                 # the index, its server and client, the endpoint registry
    ("core", ("orchestrator",)),                   # records, catalog, tools, loop, episodes, gateway, engines, sandbox
    ("data_synthesis", ("data_synthesis",)),
    ("evaluation", ("evaluation",)),
    ("training", ("training",)),
    ("serving", ("orchestrator.serve",)),          # the OpenAI-compatible server over evaluation's loop
    ("facade", ("LLM_CALL",)),                     # what users and scripts import; nothing in the packages does
    ("scripts", ("bench",)),                       # benchmarks: scripts, imported by no package
]
PACKAGES = tuple(p for _, prefixes in LAYERS for p in prefixes if "." not in p)


def layer_of(module: str, layers=LAYERS) -> int:
    """Index in `layers` of the layer `module` belongs to (its longest naming prefix)."""
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(layers) for p in prefixes
                if module == p or module.startswith(p + ".")), default=None)
    if best is None:
        raise KeyError(f"{module}: in no layer of tests/test_imports.py LAYERS; add its package there")
    return best[1]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import from a module to one of a higher layer, as "a (layer) imports b (layer)"."""
    out = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module, layers)
        for t in sorted(targets):
            there = layer_of(t, layers)
            if there > here:
                out.append(f"{module} ({layers[here][0]}) imports {t} ({layers[there][0]})")
    return out


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _named_in_string(value: str, modules) -> str | None:
    """The module a string names the way importlib registries do ("pkg.mod", "pkg.mod:Class",
    "pkg.mod.Class"), else None."""
    name = value.split(":")[0]
    if "." not in name:          # a bare word ("retrieval": a logger, a key) names no module
        return None
    if name in modules:
        return name
    parent = name.rpartition(".")[0]
    return parent if parent in modules and ":" not in value else None


def forwarded_to(tree: ast.Module) -> str | None:
    """The module an old name hands over to, else None: a file that is nothing but a docstring,
    `from orchestrator.moved import forward` and `forward(__name__, "new.module")` (a name kept
    for one release after a move).  Anything else in the file makes it a module like any other."""
    new = None
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Constant) and isinstance(call.value, str) and node is tree.body[0]:
            continue                                                        # the docstring
        if (isinstance(node, ast.ImportFrom) and node.module == "orchestrator.moved"
                and [a.name for a in node.names] == ["forward"]):
            continue
        if (new is None and isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "forward" and len(call.args) == 2
                and isinstance(call.args[0], ast.Name) and call.args[0].id == "__name__"
                and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str)):
            new = call.args[1].value
            continue
        return None
    return new


def _package_files(root: Path, packages) -> dict[str, Path]:
    files = [p for pkg in packages if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py")]
    files += [p for p in root.glob("*.py")]
    return {module_name(p, root): p for p in files}


def old_names(root: Path = ROOT, packages=PACKAGES) -> dict[str, str]:
    """{old module name: the module it moved to}, for every old name kept for one release."""
    out = {}
    for name, path in _package_files(root, packages).items():
        new = forwarded_to(ast.parse(path.read_text(), str(path)))
        if new:
            out[name] = new
    return out


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: the repository modules it imports}, for every .py file of the packages under `root`
    and its top-level modules (LLM_CALL.py): `import`/`from` statements anywhere in the file
    (module level or in functions), and strings that name a module (importlib registries).
    An old name kept for one release (`forward`, old_names) imports nothing: it is the module it
    moved to, under the name it had."""
    modules = _package_files(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        if forwarded_to(tree):
            graph[name] = set()
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") == 0:
                targets.add(_named_in_string(node.value, modules) or "")
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


def test_imports_only_go_down_the_layers():
    graph = import_graph()
    assert {"LLM_CALL", "orchestrator.serve", "retrieval.endpoints"} <= set(graph)
    bad = upward_imports(graph)
    assert not bad, ("imports against the layers (tests/test_imports.py LAYERS, docs/architecture.md "
                     "\"Import rules\"): move what both need down to the lower layer (for LLM_CALL: import "
                     "orchestrator.gateway)\n" + "\n".join(bad))


def test_nothing_imports_an_old_name():
    """Old names kept for one release (orchestrator/moved.py; orchestrator.faults, bench/faults.py's)
    are for users' scripts: no module of the repository imports one."""
    old = set(old_names()) | {"orchestrator.faults"}
    assert {"orchestrator.judge", "orchestrator.gaia_scorer"} <= old
    graph = import_graph()
    users = sorted(f"{m} imports {t}" for m, ts in graph.items() for t in ts & old)
    assert not users, "imports of old names (import the module where it lives now):\n" + "\n".join(users)
    assert all(new in graph for new in old_names().values()), old_names()


def test_an_old_name_is_no_way_around_the_layers(tmp_path):
    """Only a file that is nothing but `forward(__name__, ...)` is an old name (its string names no
    import); one with an import beside it is a module like any other, its imports checked."""
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "high/app.py").write_text("X = 1\n")
    (tmp_path / "low/old.py").write_text('from orchestrator.moved import forward\n\nforward(__name__, "high.app")\n')
    layers = [("low", ("low",)), ("high", ("high",))]
    assert old_names(tmp_path, ("low", "high")) == {"low.old": "high.app"}
    assert upward_imports(import_graph(tmp_path, ("low", "high")), layers) == []
    (tmp_path / "low/old.py").write_text('import high.app\nfrom orchestrator.moved import forward\n\n'
                                         'forward(__name__, "high.app")\n')
    assert old_names(tmp_path, ("low", "high")) == {}
    assert upward_imports(import_graph(tmp_path, ("low", "high")), layers) == \
        ["low.old (low) imports high.app (high)"]


def test_no_import_cycles():
    found = cycles(_without_package_inits(import_graph()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_catch_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_an_upward_import_is_caught_anywhere_in_a_file(tmp_path):
    """A tiny tree: `low` may be imported by `high`, not the other way round, whether the import
    is at module level, inside a function, relative, or a module named in a string."""
    layers = [("low", ("low",)), ("high", ("high",)), ("top", ("high.top",))]
    for rel, text in {"low/__init__.py": "", "low/base.py": "X = 1\n", "high/__init__.py": "",
                      "high/app.py": "from low.base import X\n", "high/top.py": "import high.app\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(tmp_path, ("low", "high"))
    assert graph["high.app"] == {"low.base"} and upward_imports(graph, layers) == []
    for text, edge in (("import high.app\n", "high.app (high)"),
                       ("def f():\n    from high import app\n", "high.app (high)"),
                       ("from ..high import app\n", "high.app (high)"),
                       ('ENGINES = {"x": "high.app:App"}\n', "high.app (high)"),
                       ("def f():\n    from high.top import g\n", "high.top (top)")):
        (tmp_path / "low/base.py").write_text(text)
        bad = upward_imports(import_graph(tmp_path, ("low", "high")), layers)
        assert f"low.base (low) imports {edge}" in bad, (text, bad)


def test_an_upward_edge_added_to_the_real_graph_is_caught():
    graph = import_graph()
    graph["retrieval.client"] = graph["retrieval.client"] | {"orchestrator.gateway.call"}
    graph["orchestrator.runtime"] = graph["orchestrator.runtime"] | {"LLM_CALL"}
    graph["evaluation.preference"] = graph["evaluation.preference"] | {"training.rewards"}
    assert upward_imports(graph) == [
        "evaluation.preference (evaluation) imports training.rewards (training)",
        "orchestrator.runtime (core) imports LLM_CALL (facade)",
        "retrieval.client (retrieval) imports orchestrator.gateway.call (core)"]
    # the serving package is the serving layer; a core module of a similar name is not
    assert [LAYERS[layer_of(m)][0] for m in ("orchestrator.serve", "orchestrator.serve.app", "orchestrator.server",
                                             "orchestrator.vllm_servers.launch")] == \
        ["serving", "serving", "core", "core"]


def test_one_generation_stack_for_training_and_the_gateway():
    """The gateway's transformers backend generates through orchestrator/engines (the engine and
    batcher training samples with)."""
    graph = import_graph()
    backend = graph["orchestrator.gateway.backends.transformers_backend"]
    assert {"orchestrator.engines.hf", "orchestrator.engines.batcher"} <= backend
    own = [str(p.relative_to(ROOT)) for p in (ROOT / "orchestrator").rglob("*.py")
           if "engines" not in p.parts and "model.generate(" in p.read_text()]
    assert not own, f"generation outside orchestrator/engines (transformers' generate): {own}"
