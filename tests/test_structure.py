"""The package's layering rules, checked from the source: no import cycle between modules (imports
inside functions included, since they only hide a cycle), and no underscore name imported from
another module (a private name is private to its module: what others need gets a public name)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "streamtopics"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]):
    """(imported module, imported names) for every import in ``path``, relative ones resolved."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                target = ".".join(parent + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in mods:  # "from . import alias_supervised" imports a module
                    yield sub, []
                else:
                    yield target, [alias.name]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def test_no_underscore_name_is_imported_from_another_module():
    mods = _modules()
    bad = []
    for name, path in mods.items():
        for target, names in _imports(name, path, mods):
            if target in mods and target != name:
                bad += [f"{name} <- {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert bad == [], "private names imported across modules:\n" + "\n".join(bad)


def test_no_import_cycles_between_modules():
    mods = _modules()
    edges = {name: set() for name in mods}
    for name, path in mods.items():
        for target, _ in _imports(name, path, mods):
            if target in mods and target != name and not name.startswith(target + "."):
                edges[name].add(target)
    # Tarjan's strongly connected components; a component of more than one module is a cycle.
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


SERVICE_SIDE = ("streamtopics.service", "streamtopics.stream", "streamtopics.testing", "streamtopics.daemon",
                "streamtopics.cli", "streamtopics.__main__", "streamtopics.config")  # __main__: python -m = the CLI


def _is(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_library_core_never_imports_kafka_or_the_service():
    """The library (model, engines, supervised, state, snapshot, ...) runs without Kafka: only the
    daemon's side composes it with kafka-python."""
    mods = _modules()
    bad = []
    for name, path in mods.items():
        if _is(name, SERVICE_SIDE) or name == "streamtopics":
            continue
        for target, _ in _imports(name, path, mods):
            if _is(target, ("kafka",) + SERVICE_SIDE):
                bad.append(f"{name} imports {target}")
    assert bad == [], "library modules importing the service side:\n" + "\n".join(bad)


def test_testing_aids_are_reached_only_from_the_composition_root():
    """Fault injection and the broker runner live in streamtopics.testing; production code reaches
    them only where the daemon is composed (service.hooks subscribes the fault injector) and in
    the demo command (which starts the bundled broker)."""
    mods = _modules()
    allowed = {"streamtopics.service.hooks", "streamtopics.cli"}
    bad = []
    for name, path in mods.items():
        if _is(name, ("streamtopics.testing",)) or name in allowed:
            continue
        for target, _ in _imports(name, path, mods):
            if _is(target, ("streamtopics.testing",)):
                bad.append(f"{name} imports {target}")
    assert bad == [], "production modules importing testing aids:\n" + "\n".join(bad)


MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 120


def _jitted(fn: ast.AST) -> bool:
    for d in getattr(fn, "decorator_list", []):
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("njit", "jit", "vectorize", "guvectorize", "generated_jit"):
            return True
    return False


def test_no_class_over_400_lines_and_no_function_over_120_outside_numba_kernels():
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            n = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            if isinstance(node, ast.ClassDef) and n > MAX_CLASS_LINES:
                long.append(f"class {name}.{node.name}: {n} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n > MAX_FUNCTION_LINES \
                    and not _jitted(node):
                long.append(f"function {name}.{node.name}: {n} lines")
    assert long == [], "too long (split by concern):\n" + "\n".join(long)
