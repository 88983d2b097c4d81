"""scripts/ are plain clients of the installed package: they import `nmt` as installed (`pip install -e .`),
never edit `sys.path` to find it, and do not import each other (what two scripts share lives in the package,
e.g. nmt/benchmarking.py). Each script's own behaviour is tested in its subject's file (test_benchmarks.py,
test_bench_gpu.py, test_prepare_bible.py, test_prepare_gettext.py, test_extract_glossary.py, test_config.py)."""

from __future__ import annotations

import ast
import glob
import os

from helpers import ROOT

SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "scripts", "*.py")))
NAMES = {os.path.splitext(os.path.basename(p))[0] for p in SCRIPTS}


def path_edits(tree: ast.AST) -> list[int]:
    """Lines that change the import path: a call of a method of `sys.path` (insert, append, extend, ...), an
    assignment to `sys.path` or to one of its items, `site.addsitedir`."""
    def is_sys_path(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
            and node.value.id == "sys"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_sys_path(node.func.value) or node.func.attr == "addsitedir":
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets):
                lines.append(node.lineno)
    return sorted(lines)


def sibling_imports(tree: ast.AST) -> list[str]:
    """Modules of scripts/ that this script imports (they are importable only from the script's directory)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in NAMES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in NAMES:
            found.append(node.module)
    return found


def test_the_checks_see_what_they_look_for():
    tree = ast.parse("import sys, site\nsys.path.insert(0, '..')\nsys.path = ['x']\nsys.path[0:0] = ['y']\n"
                     "site.addsitedir('z')\nfrom bench_train import forward_flops\nimport length_report\n"
                     "from nmt.benchmarking import eos_statistics\nprint(sys.path)\n")
    assert path_edits(tree) == [2, 3, 4, 5]
    assert sibling_imports(tree) == ["bench_train", "length_report"]


def test_no_script_edits_sys_path_or_imports_another_script():
    assert len(SCRIPTS) >= 16
    edits, imports = {}, {}
    for path in SCRIPTS:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        name = os.path.relpath(path, ROOT)
        if path_edits(tree):
            edits[name] = path_edits(tree)
        if sibling_imports(tree):
            imports[name] = sibling_imports(tree)
    assert not edits, f"scripts that edit sys.path (import nmt as installed instead): {edits}"
    assert not imports, f"scripts that import another script (move the shared code into nmt/): {imports}"
