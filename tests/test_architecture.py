"""The import graph of nmt/ (docs/architecture.md "Layers"): no circles, and every import runs downward.

Layers, top to bottom: the package's public face (`nmt/__init__.py`'s lazy `Translator`, `nmt/__main__.py`);
the commands (`nmt/commands/`) and the CLI (`nmt/cli.py`); the facades (`nmt/api.py`'s Translator,
`nmt/train.py`'s train()); the library (everything else). The library's wings, bottom to top (`WINGS`): the
base modules at the top of nmt/, then one folder each; a wing imports only its own and lower wings. Every import counts, at module level and inside
functions alike (`from nmt import x` imports nmt.x), because a function-level import closes a circle just
the same once the function runs. The graph is read from the source with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
import collections
import os
import textwrap

from helpers import ROOT

FACE = {"nmt", "nmt.__main__"}  # what users start from: `from nmt import Translator`, `python -m nmt`
FACADES = {"nmt.api", "nmt.train"}
LAYERS = ("library", "facade", "commands", "face")  # bottom to top
WINGS = ("base", "text", "data", "search", "model", "evaluation", "interop", "translation", "training")  # bottom to top
MAX_TOP_MODULES = 15  # modules at the top of nmt/ (the base, the facades, the CLI, the face)


def modules(root: str, package: str = "nmt") -> dict[str, str]:
    """{dotted module name: path} of every .py file under root/package."""
    out = {}
    for directory, _, files in os.walk(os.path.join(root, package)):
        for name in sorted(files):
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(directory, name), root)[: -len(".py")].split(os.sep)
                out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(directory, name)
    return out


def imported(name: str, path: str, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` (at `path`) imports anywhere in its code."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..y import z
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from nmt import textio` imports the module nmt.textio; `from nmt import Translator`, the package
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    out = set()
    for target in targets:
        while target and target not in known:  # `import nmt.x.y` of a name inside nmt.x: nmt.x
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def import_graph(root: str = ROOT, package: str = "nmt") -> dict[str, set[str]]:
    found = modules(root, package)
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def layer(module: str) -> str:
    if module in FACE:
        return "face"
    if module == "nmt.cli" or module == "nmt.commands" or module.startswith("nmt.commands."):
        return "commands"
    return "facade" if module in FACADES else "library"


def wing(module: str) -> str | None:
    """The library wing of a module (None outside the library)."""
    if layer(module) != "library":
        return None
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or module.endswith(tuple(f".{w}" for w in WINGS)) else "base"


def across_wings(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a library wing into a higher one."""
    return [f"{a} ({wing(a)}) imports {b} ({wing(b)})" for a in sorted(graph) for b in sorted(graph[a])
            if wing(a) and wing(b) and WINGS.index(wing(b)) > WINGS.index(wing(a))]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def circles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """For every group of modules that import each other in turn: (a shortest circle a -> ... -> a through its
    first module, every module of the group)."""
    reach = {name: reachable(graph, name) for name in graph}
    out, done = [], set()
    for name in sorted(graph):
        if name in done or name not in reach[name]:
            continue
        group = {m for m in reach[name] if name in reach[m]}
        done |= group
        paths, todo = {name: [name]}, collections.deque([name])  # breadth first, inside the group
        while todo:
            current = todo.popleft()
            for nxt in sorted(graph[current] & group):
                if nxt == name:
                    out.append((paths[current] + [name], sorted(group)))
                    todo.clear()
                    break
                if nxt not in paths:
                    paths[nxt] = paths[current] + [nxt]
                    todo.append(nxt)
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run up: a library module importing a facade, a command or the face; a facade importing a
    command or the face."""
    return [f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a in sorted(graph) for b in sorted(graph[a])
            if LAYERS.index(layer(b)) > LAYERS.index(layer(a)) and layer(a) in ("library", "facade")]


# --------------------------------------------------------------------------- nmt/

def test_the_graph_is_read_from_every_kind_of_import():
    """The reader sees module-level, function-level and `from nmt import x` imports (else the tests below
    would pass on an empty graph)."""
    graph = import_graph()
    assert {"nmt", "nmt.__main__", "nmt.api", "nmt.cli", "nmt.search"} <= set(graph)
    assert "nmt.translation.translate" in graph["nmt.api"]  # module level
    assert "nmt.translation.score" in graph["nmt.api"]  # inside Translator.score
    assert "nmt.model.fast" in graph["nmt.translation.torch_engine"]  # `from nmt.model.fast import ...`, inside a function
    assert "nmt.api" in graph["nmt"]  # the lazy Translator


def test_no_circles():
    found = circles(import_graph())
    assert not found, "import circles in nmt/:\n" + "\n".join(
        f"{' -> '.join(path)} (modules in this circle: {', '.join(group)})" for path, group in found)


def test_imports_run_downward():
    """library -> facades (nmt.api, nmt.train) -> commands (nmt/commands/, nmt/cli.py) -> the face."""
    found = upward(import_graph())
    assert not found, "imports that run up a layer:\n" + "\n".join(found)


def test_each_wing_imports_only_its_own_and_lower_wings():
    graph = import_graph()
    assert {wing(m) for m in graph} - {None} == set(WINGS)  # every wing has modules; no stray one
    found = across_wings(graph)
    assert not found, "imports from a wing into a higher one:\n" + "\n".join(found)


def test_the_top_of_nmt_holds_few_modules():
    top = sorted(name for name in os.listdir(os.path.join(ROOT, "nmt")) if name.endswith(".py"))
    assert len(top) <= MAX_TOP_MODULES, top


# --------------------------------------------------------------------------- the checks themselves

def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    """A package whose module b imports a inside a function, a imports b at the top, c is apart."""
    pkg = tmp_path / "nmt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from nmt import b\n")
    (pkg / "b.py").write_text(textwrap.dedent("""\
        import os


        def f():
            from nmt.a import thing
            return thing
        """))
    (pkg / "c.py").write_text("import nmt.b\n")
    graph = import_graph(str(tmp_path))
    assert graph == {"nmt": set(), "nmt.a": {"nmt.b"}, "nmt.b": {"nmt.a"}, "nmt.c": {"nmt.b"}}
    assert circles(graph) == [(["nmt.a", "nmt.b", "nmt.a"], ["nmt.a", "nmt.b"])]


def test_an_import_up_a_layer_is_found():
    graph = {"nmt.search": {"nmt.api"}, "nmt.api": {"nmt.commands.translate", "nmt.search"},
             "nmt.commands.translate": {"nmt.api"}, "nmt.cli": {"nmt.commands.translate", "nmt"},
             "nmt": {"nmt.api"}, "nmt.training.validation": {"nmt"}}
    assert upward(graph) == [
        "nmt.api (facade) imports nmt.commands.translate (commands)",
        "nmt.search (library) imports nmt.api (facade)",
        "nmt.training.validation (library) imports nmt (face)"]
    assert across_wings({"nmt.text.glossary": {"nmt.search.rules", "nmt.errors"}, "nmt.search.rules": {"nmt.text.glossary"},
                         "nmt.errors": {"nmt.model"}, "nmt.model": set()}) == [
        "nmt.errors (base) imports nmt.model (model)", "nmt.text.glossary (text) imports nmt.search.rules (search)"]


def imports_of_test_modules(tests_dir: str) -> list[str]:
    """`file: module` for every test module a file of `tests_dir` imports (shared code lives in helpers.py)."""
    out = []
    for name in sorted(os.listdir(tests_dir)):
        if name.endswith(".py"):
            with open(os.path.join(tests_dir, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
                {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            out += [f"{name}: {m}" for m in sorted(found) if m.split(".")[0].startswith("test_")]
    return out


def test_tests_import_shared_code_from_helpers(tmp_path):
    assert imports_of_test_modules(os.path.join(ROOT, "tests")) == []
    (tmp_path / "test_a.py").write_text("from test_b import thing\nimport helpers\n")
    (tmp_path / "test_b.py").write_text("def f():\n    import test_a\n")
    assert imports_of_test_modules(str(tmp_path)) == ["test_a.py: test_b", "test_b.py: test_a"]


def kind_probes(root: str) -> list[str]:
    """`path:line` of every `x.get("kind", ...)` and `getattr(x, "kind", ...)` in nmt/: code asks a tokenizer
    object for its kind (`TokenizerLike.kind`); only `Tokenizer.from_bytes` reads a stored entry's."""
    out = []
    for name, path in sorted(modules(root).items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            getter = isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
            probe = isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3
            key = node.args[0] if getter else node.args[1] if probe else None
            if isinstance(key, ast.Constant) and key.value == "kind":
                out.append(f"{os.path.relpath(path, root)}:{node.lineno}")
    return out


def test_no_tokenizer_kind_probes(tmp_path):
    assert kind_probes(ROOT) == []
    pkg = tmp_path / "nmt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text('a = entry.get("kind", "spm")\nb = getattr(tok, "kind", "spm")\nc = d.get("other")\n')
    assert kind_probes(str(tmp_path)) == [os.path.join("nmt", "probe.py") + ":1", os.path.join("nmt", "probe.py") + ":2"]


MAX_FUNCTION_STATEMENTS = 60  # a function reads top to bottom on one screen; its docstring does not count


def statements(function: ast.AST) -> int:
    """The statements inside a function: nested blocks and functions included, docstrings (its own and
    those of nested functions and classes) left out; a statement over several lines counts once."""
    docs = {id(n.body[0]) for n in ast.walk(function)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(n) is not None}
    return sum(isinstance(n, ast.stmt) and id(n) not in docs for n in ast.walk(function)) - 1  # (not the def)


def long_functions(root: str) -> list[str]:
    """`path:name (statements)` of every function or method of nmt/ with more than MAX_FUNCTION_STATEMENTS."""
    out = []
    for name, path in sorted(modules(root).items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and statements(node) > MAX_FUNCTION_STATEMENTS:
                out.append(f"{os.path.relpath(path, root)}:{node.name} ({statements(node)})")
    return out


def test_no_function_over_sixty_statements(tmp_path):
    assert long_functions(ROOT) == []
    pkg = tmp_path / "nmt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    doc = lambda indent: indent + '"""' + "A docstring line.\n" * 80 + indent + '"""\n'  # noqa: E731
    (pkg / "long.py").write_text(
        "def f():\n" + "    x = 1\n" * 61  # 61 statements: the check can fail
        + "\n\ndef g():\n" + doc("    ") + "    if True:\n" + "        x = 1\n" * 58 + "    return (x,\n"
        + "            x,\n" * 30 + ")\n"
        + "\n\ndef h():\n" + doc("    ") + "    def inner():\n" + doc("        ") + "        return 1\n" + "    x = 1\n" * 59)
    # g: 60 statements over 170 lines; h: 61 with the nested function's
    assert long_functions(str(tmp_path)) == [os.path.join("nmt", "long.py") + ":f (61)",
                                             os.path.join("nmt", "long.py") + ":h (61)"]
