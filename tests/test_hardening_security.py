"""No code execution from data: the package never unpickles, evals or execs anything."""
from __future__ import annotations

import ast
from pathlib import Path


PKG = Path(__file__).resolve().parents[1] / "streamtopics"
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _violations(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            out += [f"{name}:{node.lineno} import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            out.append(f"{name}:{node.lineno} from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_CALLS:
                out.append(f"{name}:{node.lineno} {f.id}()")
            if isinstance(f, ast.Attribute) and f.attr == "load" and isinstance(f.value, ast.Name) and f.value.id == "np":
                kw = {k.arg: k.value for k in node.keywords}
                if not (isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value is False):
                    out.append(f"{name}:{node.lineno} np.load without allow_pickle=False")
    return out


def test_the_checker_catches_what_it_looks_for():
    bad = "import pickle\nfrom marshal import loads\neval('1')\nexec('x=1')\nimport numpy as np\nnp.load('f')\n"
    assert len(_violations(bad, "bad.py")) == 5


def test_no_pickle_eval_or_exec_in_the_package():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        found += _violations(path.read_text(), str(path.relative_to(PKG.parent)))
    assert not found, found
