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
