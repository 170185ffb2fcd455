"""The code a backend runs, derived from the source: a graph of top-level symbols (functions,
classes, module-level code) of the library's modules, with an edge wherever one names another.

Each module's symbols are read with :mod:`ast`, never imported. A symbol depends on

* what its body names: a function, class or constant of its own module, a name it imported
  (followed through re-exports to the module defining it), an attribute of an imported module
  (``calls.call_sdpa``), a module it imports inside a function;
* its module's module-level code (constants, registrations): every symbol does.

A class is one symbol (its methods call each other through ``self``), except its methods named
``backward``: they run only when a gradient is computed (an ``autograd.Function``'s, a
FlashAttention implementation's), so they are symbols of their own, reached over *backward*
edges. The closure from a backend's roots without those edges is what a forward runs; with them,
what a training step runs.

What the graph cannot see, and :mod:`attnkit_perf.select.rules` takes as data: files that are not
Python (tile tables, C++), dispatch by name (the registry, ``backend="auto"``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

#: A graph node: (module, symbol); symbol "" is the module-level code.
Node = tuple[str, str]


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    #: top-level def/class name -> its AST node
    defs: dict[str, ast.AST] = field(default_factory=dict)
    #: name bound by an import -> ("module", module) or ("symbol", module, name)
    imports: dict[str, tuple] = field(default_factory=dict)
    #: names assigned by module-level code
    assigned: set[str] = field(default_factory=set)
    body: list[ast.stmt] = field(default_factory=list)


def _import_targets(stmt: ast.AST, module: str, is_package: bool, known: set[str]) -> dict[str, tuple]:
    """name -> target of one import statement."""
    bound = {}
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.asname:
                bound[alias.asname] = ("module", alias.name)
            else:  # `import a.b` binds a
                bound[alias.name.split(".")[0]] = ("module", alias.name.split(".")[0])
    elif isinstance(stmt, ast.ImportFrom):
        base = stmt.module or ""
        if stmt.level:
            parts = module.split(".")
            keep = len(parts) - stmt.level + (1 if is_package else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        for alias in stmt.names:
            sub = f"{base}.{alias.name}"
            target = ("module", sub) if sub in known else ("symbol", base, alias.name)
            bound[alias.asname or alias.name] = target
    return bound


def parse(name: str, path: Path, is_package: bool, known: set[str]) -> Module:
    mod = Module(name, path, is_package)
    tree = ast.parse(path.read_text(encoding="utf8"), str(path))
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs[stmt.name] = stmt
            continue
        mod.body.append(stmt)
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod.imports.update(_import_targets(node, name, is_package, known))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                mod.assigned.add(node.id)
    return mod


class SymbolGraph:
    """The symbol graph of the modules under ``roots`` (``{package name: its directory}``)."""

    def __init__(self, packages: dict[str, Path]) -> None:
        files = {}
        for package, directory in packages.items():
            for path in sorted(directory.rglob("*.py")):
                parts = [package, *path.relative_to(directory).with_suffix("").parts]
                is_package = parts[-1] == "__init__"
                if is_package:
                    parts = parts[:-1]
                files[".".join(parts)] = (path, is_package)
        known = set(files)
        self.modules = {name: parse(name, path, pkg, known) for name, (path, pkg) in files.items()}
        #: node -> [(node, backward edge?)]
        self.edges: dict[Node, list[tuple[Node, bool]]] = {}
        for mod in self.modules.values():
            self._link(mod)

    def path_of(self, module: str) -> Path:
        return self.modules[module].path

    # --- resolution ------------------------------------------------------------------------

    def resolve(self, module: str, name: str, seen: frozenset = frozenset()) -> list[Node]:
        """The nodes ``module.name`` stands for (re-exports followed); [] outside the graph."""
        if module not in self.modules or (module, name) in seen:
            return []
        seen = seen | {(module, name)}
        mod = self.modules[module]
        if name in mod.defs:
            return [(module, name)]
        if name in mod.imports:
            return self._target(mod.imports[name], seen)
        if f"{module}.{name}" in self.modules:
            return self.whole(f"{module}.{name}")
        return [(module, "")]

    def _target(self, target: tuple, seen: frozenset = frozenset()) -> list[Node]:
        if target[0] == "module":
            return self.whole(target[1]) if target[1] in self.modules else []
        return self.resolve(target[1], target[2], seen)

    def whole(self, module: str) -> list[Node]:
        """Every node of ``module`` (a module object handed around: any of it may run)."""
        mod = self.modules[module]
        return [(module, ""), *((module, name) for name in mod.defs)]

    # --- edges -------------------------------------------------------------------------------

    def _refs(self, mod: Module, nodes: list[ast.AST]) -> list[Node]:
        found: list[Node] = []
        for top in nodes:
            for node in ast.walk(top):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not isinstance(top, ast.Module):
                    for target in _import_targets(node, mod.name, mod.is_package, set(self.modules)).values():
                        found += self._target(target)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    bound = mod.imports.get(node.value.id)
                    if bound and bound[0] == "module" and bound[1] in self.modules:
                        found += self.resolve(bound[1], node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    name = node.id
                    if name in mod.defs:
                        found.append((mod.name, name))
                    elif name in mod.imports:
                        bound = mod.imports[name]
                        if bound[0] == "symbol":  # a module alias counts through its attributes
                            found += self._target(bound)
                    elif name in mod.assigned:
                        found.append((mod.name, ""))
        return found

    def _link(self, mod: Module) -> None:
        top: Node = (mod.name, "")
        body_only = [s for s in mod.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        self.edges[top] = [(n, False) for n in self._refs(mod, body_only)]
        for name, node in mod.defs.items():
            edges = [(top, False)]
            parts = [node]
            if isinstance(node, ast.ClassDef):
                parts = [s for s in node.body if not _is_backward(s)]
                parts += node.decorator_list + node.bases
                for method in (s for s in node.body if _is_backward(s)):
                    back: Node = (mod.name, f"{name}.backward")
                    self.edges[back] = [(top, False), *((n, False) for n in self._refs(mod, [method]))]
                    edges.append((back, True))
            edges += [(n, False) for n in self._refs(mod, parts)]
            self.edges[(mod.name, name)] = edges

    def closure(self, roots: list[Node], backward: bool, cut: set = frozenset()) -> set[Node]:
        """Every node reachable from ``roots``; over backward edges only when ``backward``; no
        edge from module ``a`` into module ``b`` for ``(a, b)`` in ``cut``."""
        seen: set[Node] = set()
        stack = list(roots)
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            for target, is_backward in self.edges.get(node, ()):
                if is_backward and not backward:
                    continue
                if (node[0], target[0]) in cut:
                    continue
                stack.append(target)
        return seen


def _is_backward(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == "backward"
