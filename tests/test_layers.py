"""Layers that point one way (#61 item 6; docs/DESIGN.md "Layers" draws this table).

Every import in cure_core, cure_tasks and cure_cli is read with `ast`, imports inside functions included
(a function-level import hides a cycle from Python, not from this test). The rules:
- the packages point one way: cure_cli -> cure_tasks -> cure_core, and cure_core and cure_tasks import no
  UI library (textual, rich, typer);
- every cure_core module has one layer in CORE_LAYERS, and imports only from its own layer or those below;
- no import cycle anywhere, within a layer either.
A new module gets a row here; a new import that points up fails with its file and line.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cure_core", "cure_tasks", "cure_cli")      # each imports only from those before it
UI = {"textual", "rich", "typer"}

# cure_core's layers, bottom first.
CORE_LAYERS = (
    ("foundations: types, records, the catalog (no model code)",
     {"version", "errors", "files", "progress", "catalog", "config", "block", "tree", "metrics", "records",
      "trace", "prompt_text"}),
    ("compute: kernels and the cached LM",
     {"attention", "cpu_kernels", "int8_decoder", "lm"}),
    ("drafters",
     {"drafters", "drafters.base", "drafters.vocab", "drafters.causal", "drafters.dflash", "drafters.adapted"}),
    ("engine: the loop, its tree policies and their learners",
     {"lookup", "redraft_price", "acceptance", "budget", "strategies", "policies", "engine"}),
    ("loading: checkpoints by name into a pair",
     {"embedded", "checkpoints", "thinking", "models"}),
    ("face: what users and tools call",
     {"", "api", "options", "analysis", "vllm_export", "tiny"}),
    ("training",
     {"training", "training.adapt_train", "training.cards", "training.checkpoint", "training.corpus",
      "training.dflash_train", "training.distill", "training.evaluate", "training.features",
      "training.pard_train", "training.prepare", "training.prompt_mix", "training.run", "training.trainer"}),
)


def module_files() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its own name)."""
    found = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def imports_of(name: str, source: str, is_package: bool = False, known=()) -> list[tuple[str, int]]:
    """(imported module, line) for every import in `source`, the module `name`, wherever it stands (in a
    function too). Relative imports are made absolute; `from pkg import x` is pkg.x where that is a module
    in `known`, else pkg."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + [node.module] if node.module else
                            here[:len(here) - node.level + 1]) if node.level else node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in known else base, node.lineno))
    return out


def ours(target: str, known) -> str | None:
    """The module of ours `target` names (its nearest enclosing one), or None for a third-party import."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def graph() -> dict[str, list[tuple[str, int]]]:
    """module -> [(module of ours it imports, line)]."""
    files = module_files()
    edges = {}
    for name, f in files.items():
        found = imports_of(name, f.read_text(encoding="utf-8"), f.name == "__init__.py", files)
        edges[name] = [(m, line) for t, line in found if (m := ours(t, files)) is not None and m != name]
    return edges


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                w = w[0]
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges.get(w, ()))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def core_layer() -> dict[str, int]:
    return {("cure_core." + m).rstrip("."): i for i, (_, mods) in enumerate(CORE_LAYERS) for m in mods}


def test_every_core_module_has_one_layer():
    named = [("cure_core." + m).rstrip(".") for _, mods in CORE_LAYERS for m in mods]
    assert len(named) == len(set(named)), "a module is in two layers"
    core = {m for m in module_files() if m.split(".")[0] == "cure_core"}
    assert not core - set(named), f"modules with no layer (add them to CORE_LAYERS): {sorted(core - set(named))}"
    assert not set(named) - core, f"layers name modules that are gone: {sorted(set(named) - core)}"


def test_core_imports_point_down_the_layers():
    layer = core_layer()
    back = {f"{a} (line {line}, {CORE_LAYERS[layer[a]][0].split(':')[0]}) imports {b} "
            f"({CORE_LAYERS[layer[b]][0].split(':')[0]})"
            for a, found in sorted(graph().items()) if a in layer
            for b, line in found if b in layer and layer[b] > layer[a]}
    assert not back, "imports that point up the layers:\n" + "\n".join(sorted(back))


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_packages_point_one_way_and_the_core_has_no_ui():
    rank = {p: i for i, p in enumerate(PACKAGES)}
    files = module_files()
    bad = []
    for name, f in files.items():
        pkg = name.split(".")[0]
        for target, line in imports_of(name, f.read_text(encoding="utf-8"), f.name == "__init__.py", files):
            top = target.split(".")[0]
            if top in rank and rank[top] > rank[pkg]:
                bad.append(f"{name} (line {line}) imports {target}: {pkg} may not import {top}")
            if top in UI and pkg != "cure_cli":
                bad.append(f"{name} (line {line}) imports the UI library {top}")
    assert not bad, "\n".join(bad)


def test_the_reader_sees_imports_inside_functions_and_relative_ones():
    """What the rules above stand on: a function-level import and every relative form are read."""
    known = {"cure_core", "cure_core.models", "cure_core.drafters", "cure_core.drafters.adapted", "cure_core.version"}
    src = ("from ..errors import ModelLoadError\nfrom .. import version\n"
           "def load():\n    from ..models import load_model\n    import cure_core.models as M\n")
    got = imports_of("cure_core.drafters.adapted", src, known=known)
    assert got == [("cure_core.errors", 1), ("cure_core.version", 2), ("cure_core.models", 4), ("cure_core.models", 5)]
    assert imports_of("cure_core", "from .version import __version__\n", is_package=True, known=known) == \
        [("cure_core.version", 1)]
    assert cycles({"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}) == [["a", "b", "c"]]
