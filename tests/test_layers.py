"""The package's layers (ARCHITECTURE.md): every import of the package's own modules
runs down a layer or stays within one, at module level, and no set of modules imports
itself in a circle.  Read from the source with ``ast``: nothing is imported."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pyspmv_cl"

# Lowest first.  A module not listed belongs to the layer of its package.
LAYERS = [
    {"_version", "errors", "store", "features", "launching", "codegen", "cache",
     "host_arrays", "host_buffers", "device", "inputs", "device_inputs", "background_upload",
     "kernel_objects", "pinned_staging", "numbering", "array_ops"},
    {"formats"},
    {"tuning"},
    {"matrix", "adjoint", "block_copy"},
    {"distributed"},
    {"__init__", "__main__", "cli", "bench"},
]


def module_name(path):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(name):
    head = name.split(".")[0]
    for i, members in enumerate(LAYERS):
        if head in members:
            return i
    raise AssertionError(f"module {name!r} is in no layer: add it to LAYERS and "
                         "ARCHITECTURE.md")


def resolve(name, node, is_package):
    """The package-relative names an import statement in module ``name`` reaches."""
    if isinstance(node, ast.Import):
        return [a.name[len("pyspmv_cl."):] for a in node.names
                if a.name.startswith("pyspmv_cl.")]
    if node.level == 0:
        if not (node.module or "").startswith("pyspmv_cl"):
            return []
        base = node.module[len("pyspmv_cl"):].lstrip(".")
    else:
        here = name.split(".") if name != "__init__" else []
        if not is_package:
            here = here[:-1]
        here = here[:len(here) - (node.level - 1)] if node.level > 1 else here
        base = ".".join(here + ([node.module] if node.module else []))
    out = []
    for alias in node.names:
        full = f"{base}.{alias.name}" if base else alias.name
        out.append(full if full in MODULES else base)
    return [o for o in out if o]


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports():
    """(module, imported module, at module level?, line) for every own import."""
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        top = set()
        for node in tree.body:
            for sub in ast.walk(node) if isinstance(node, ast.If) else [node]:
                top.add(id(sub))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in resolve(name, node, is_package):
                    target = target if target in MODULES else target.rsplit(".", 1)[0]
                    if target and target != name:
                        found.append((name, target, id(node) in top, node.lineno))
    return found


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_import_runs_up_a_layer():
    upward = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)}) at line {line}"
              for a, b, _, line in imports() if layer_of(b) > layer_of(a)]
    assert not upward, "\n".join(upward)


def test_no_own_import_inside_a_function():
    """An import of the package's own modules inside a function is how circles were
    hidden; optional third-party imports (torch, cupy, matplotlib) may stay lazy."""
    hidden = [f"{a} imports {b} inside a function (line {line})"
              for a, b, top, line in imports() if not top]
    assert not hidden, "\n".join(hidden)


def test_no_import_circle():
    graph = {}
    for a, b, _, _ in imports():
        graph.setdefault(a, set()).add(b)
    # A module importing its own package's __init__ (or a parent package) is how Python
    # resolves submodules, not a dependency on the package's other modules.
    for a in graph:
        graph[a] = {b for b in graph[a] if not a.startswith(b + ".")}
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_layers_listed_exist(layer):
    """A layer entry that matches no module is a stale name."""
    heads = {name.split(".")[0] for name in MODULES}
    assert LAYERS[layer] <= heads, LAYERS[layer] - heads
