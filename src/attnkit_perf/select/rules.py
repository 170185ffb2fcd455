"""What a diff can affect: each changed file's effect, from the symbol graph of the library
(:mod:`attnkit_perf.select.symbols`) and the declared dependencies (``dependencies.json``: the
backends' roots, shared code, data files and who reads them, files that affect nothing).

A file's effect is one of

* ``everything``: shared code, the gate, the tests' configuration, dependencies, or a file no
  rule maps (a new module no backend reaches yet, a deleted or renamed module, anything unknown);
* ``backends``: the backends whose code reaches it, each with the passes it can change: ``all``,
  or ``backward`` when only a gradient's code reaches it (rows timing a backward);
  a GPU-keyed table (``{gpu}`` in its path) only on that GPU model;
* ``correctness``: an entry point no perf row calls (the correctness tests importing it run), or
  a correctness test module (it runs);
* ``nothing``: documentation and the CPU job's own tests.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import json
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from attnkit_perf.select.symbols import SymbolGraph

DEPENDENCIES = Path(__file__).with_name("dependencies.json")
#: Passes that run a backward: the rows a change to a gradient's code alone can affect.
BACKWARD_PASSES = ("bwd", "fwd+bwd")


@dataclass(frozen=True)
class Effect:
    """What one changed file can affect (module docstring)."""

    path: str
    kind: str
    why: str
    #: backend -> "all" or "backward" (kind ``backends``)
    backends: dict = field(default_factory=dict)
    #: the GPU model a GPU-keyed table belongs to, or None
    gpu: str | None = None
    #: the table entries (e.g. Triton's shape families) whose content changed, where the reader
    #: looks up one entry per row; None: any row may read a changed part
    entries: tuple | None = None


def _glob(pattern: str) -> re.Pattern:
    """``fnmatch`` with ``{gpu}`` capturing one path segment."""
    head, sep, tail = pattern.partition("{gpu}")
    if not sep:
        return re.compile(fnmatch.translate(pattern))
    left = fnmatch.translate(head).removesuffix(r"\Z").removeprefix("(?s:").removesuffix(")")
    right = fnmatch.translate(tail).removeprefix("(?s:").removesuffix(r")\Z")
    return re.compile(f"(?s:{left}(?P<gpu>[^/]+){right})\\Z")


class DependencyMap:
    """The declared dependencies and the graph of the code under ``root`` (a checkout)."""

    def __init__(self, root: Path, table: Path = DEPENDENCIES) -> None:
        self.root = Path(root).absolute()
        self.table = json.loads(Path(table).read_text(encoding="utf8"))
        src = self.root / "src"
        self.graph = SymbolGraph({p: src / p for p in ("attnkit", "attnkit_tools") if (src / p).is_dir()})
        self.modules_by_path = {
            m.path.relative_to(self.root).as_posix(): name for name, m in self.graph.modules.items()
        }

    @property
    def backend_names(self) -> list[str]:
        return list(self.table["backends"])

    def _paths(self, key: str) -> list[re.Pattern]:
        return [_glob(p) for p in self.table[key]["paths"]]

    @cached_property
    def passes_by_module(self) -> dict[str, dict[str, str]]:
        """module -> {backend: "all" | "backward"} for every module a backend's code reaches."""
        reached: dict[str, dict[str, str]] = {}
        for name, spec in self.table["backends"].items():
            spec = self.table["backends"].get(spec.get("same_as"), spec)
            roots = [n for r in spec["roots"] for n in self.graph.resolve(*r.split(":"))]
            forward = {m for m, _ in self.graph.closure(roots, backward=False)}
            training = {m for m, _ in self.graph.closure(roots, backward=True)}
            for module in training:
                reached.setdefault(module, {})[name] = "all" if module in forward else "backward"
        return reached

    @cached_property
    def shared_modules(self) -> set[str]:
        """Modules shared code reaches: the declared shared modules and what they run (edges the
        table narrows excepted; registration modules' references are roots, not shared code)."""
        registration = set(self.table["registration"]["modules"])
        patterns = self._paths("shared")
        shared = [
            module
            for path, module in self.modules_by_path.items()
            if module not in registration and any(p.match(path) for p in patterns)
        ]
        cut = {(n["from"], n["to"]) for n in self.table["narrowed"]}
        roots = [node for module in shared for node in self.graph.whole(module)]
        return {m for m, _ in self.graph.closure(roots, backward=True, cut=cut)} | registration

    def effect(self, path: str, before: str | None = None) -> Effect:
        """The effect of a change to ``path`` (relative to the repository root, existing or not);
        ``before``: its text at the base, where known (a table keyed by entries is then compared
        entry by entry)."""
        if any(p.match(path) for p in self._paths("nothing")):
            return Effect(path, "nothing", self.table["nothing"]["why"])
        if any(p.match(path) for p in self._paths("shared")):
            return Effect(path, "everything", f"shared: {self.table['shared']['why']}")
        for entry in self.table["data"]:
            for pattern in map(_glob, entry["paths"]):
                found = pattern.match(path)
                if found:
                    effect = self._data_effect(path, entry, found.groupdict().get("gpu"))
                    if entry.get("entries") and before is not None:
                        changed = _changed_entries(before, self.root / path, entry["entries"])
                        effect = dataclasses.replace(effect, entries=changed)
                    return effect
        for key in ("tests_only", "test_modules"):
            if any(p.match(path) for p in self._paths(key)):
                return Effect(path, "correctness", self.table[key]["why"])
        module = self.modules_by_path.get(path)
        if module is None:
            return Effect(path, "everything", "not mapped (no module of this tree, no rule)")
        if module in self.shared_modules:
            return Effect(path, "everything", f"{module} is run by shared code")
        backends = self.passes_by_module.get(module)
        if not backends:
            return Effect(path, "everything", f"{module} is reached from no backend's roots (not mapped)")
        return Effect(path, "backends", f"{module} is run by these backends' code", dict(backends))

    def _data_effect(self, path: str, entry: dict, gpu: str | None) -> Effect:
        if entry.get("every_backend"):
            return Effect(path, "backends", entry["why"], dict.fromkeys(self.backend_names, "all"), gpu)
        module, symbol = entry["read_by"].split(":")
        reader = self.graph.resolve(module, symbol)
        backends = {}
        for name, spec in self.table["backends"].items():
            spec = self.table["backends"].get(spec.get("same_as"), spec)
            roots = [n for r in spec["roots"] for n in self.graph.resolve(*r.split(":"))]
            if set(reader) & self.graph.closure(roots, backward=False):
                backends[name] = "all"
            elif set(reader) & self.graph.closure(roots, backward=True):
                backends[name] = "backward"
        return Effect(path, "backends", f"{entry['why']} (read by {entry['read_by']})", backends, gpu)

    def test_backends(self, source: str) -> set[str]:
        """The backends a correctness test module names (string constants) or imports code of."""
        tree = ast.parse(source)
        names = set(self.backend_names)
        found = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                if module not in self.shared_modules:
                    found |= set(self.passes_by_module.get(module, {}))
        return found

    def test_imports(self, source: str) -> set[str]:
        """Paths of the library modules a test module imports, and what those import."""
        tree = ast.parse(source)
        roots = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                roots += [n for a in node.names for n in self.graph.resolve(node.module, a.name)]
            elif isinstance(node, ast.Import):
                known = [a.name for a in node.names if a.name in self.graph.modules]
                roots += [n for name in known for n in self.graph.whole(name)]
        reached = {m for m, _ in self.graph.closure(roots, backward=True)}
        return {p for p, m in self.modules_by_path.items() if m in reached}


def _changed_entries(before: str, after: Path, key: str) -> tuple | None:
    """The names of the ``key`` entries that differ between the JSON texts, or None when either
    side does not read as such a table (then every entry counts as changed)."""
    try:
        old = json.loads(before)[key]
        new = json.loads(after.read_text(encoding="utf8"))[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    return tuple(sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name)))


def tile_family(case) -> str:
    """The Triton shape family a perf case's config is read under, causal or not alike: the
    decision whether a problem runs as causal (a one-query decode sees every key) is the
    kernel's, so both count (:func:`attnkit.triton.config.family_key`)."""
    from attnkit.triton.config import padded_dim

    width = "fp32" if case.dtype == "fp32" else "16bit"
    return f"{width}-d{padded_dim(case.head_dim)}"


@dataclass
class Affected:
    """The effects of a diff's files, for a run on GPU model ``gpu`` (None: any)."""

    base: str
    changed: list[str]
    effects: list[Effect]
    gpu: str | None = None
    auto_backends: tuple = ("auto",)
    #: the backends the map knows; any other (a plugin's) is never deselected: its code is not mapped
    known: tuple | None = None

    def applies(self, effect: Effect) -> bool:
        return effect.gpu is None or self.gpu is None or effect.gpu == self.gpu

    @property
    def everything(self) -> list[Effect]:
        return [e for e in self.effects if e.kind == "everything"]

    @property
    def backends(self) -> dict[str, str]:
        """backend -> "all" | "backward", over the effects that apply here."""
        merged: dict[str, str] = {}
        for effect in self.effects:
            if effect.kind != "backends" or not self.applies(effect):
                continue
            for name, passes in effect.backends.items():
                merged[name] = "all" if "all" in (passes, merged.get(name)) else "backward"
        if merged:
            for name in self.auto_backends:  # auto dispatches to any of them
                merged[name] = "all" if "all" in merged.values() else "backward"
        return merged

    def entries(self, backend: str) -> set[str] | None:
        """The table entries the diff changed for ``backend`` where every effect on it is such a
        table's, else None (any row of it may be affected)."""
        found: set[str] = set()
        for effect in self.effects:
            if effect.kind != "backends" or not self.applies(effect) or backend not in effect.backends:
                continue
            if effect.entries is None:
                return None
            found |= set(effect.entries)
        return found

    def row_skip(self, backend: str, pass_name: str, case=None) -> str | None:
        """Why a perf row of ``backend`` timing ``pass_name`` (``case``: its
        :class:`~attnkit_perf.measure.cases.BenchCase`) need not run, or None."""
        if self.everything or (self.known is not None and backend not in self.known):
            return None
        passes = self.backends.get(backend)
        if passes is None:
            return f"backend {backend}: no changed file reaches its code"
        if passes == "backward" and pass_name not in BACKWARD_PASSES:
            return f"backend {backend}: the diff reaches only its backward, and this row times a forward"
        entries = self.entries(backend) if case is not None and backend == "triton" else None
        if entries is not None:
            family = tile_family(case)
            if not any(name.startswith(family + "-") for name in entries):
                changed = ", ".join(sorted(entries)) or "none"
                return f"backend {backend}: its tile table changed families {changed}, not {family}"
        return None

    def to_dict(self) -> dict:
        return {
            "base": self.base,
            "gpu": self.gpu,
            "everything": bool(self.everything),
            "backends": self.backends,
            "changed": [asdict(e) for e in self.effects],
        }

    def describe(self) -> list[str]:
        """Lines for people: the decision, then each changed file's effect."""
        if self.everything:
            first = self.everything[0]
            more = len(self.everything) - 1
            head = f"everything: {first.path} ({first.why})" + (f" and {more} more file(s)" if more else "")
        elif self.backends:
            head = "backends: " + ", ".join(f"{b} ({p} passes)" for b, p in sorted(self.backends.items()))
        elif any(e.kind == "correctness" for e in self.effects):
            head = "no perf row: the correctness tests that are changed or import a changed file"
        else:
            head = "nothing: no changed file reaches a backend's code, the gate or shared code"
        lines = [head]
        for e in self.effects:
            other = "" if self.applies(e) else ": not this GPU"
            where = "" if e.gpu is None else f" [on {e.gpu} only{other}]"
            targets = f" -> {', '.join(f'{b}:{p}' for b, p in e.backends.items())}" if e.backends else ""
            entries = "" if e.entries is None else f" [entries changed: {', '.join(e.entries) or 'none'}]"
            lines.append(f"  {e.path}: {e.kind}{targets}{where}{entries}: {e.why}")
        return lines


def affected(
    root: Path, base: str, changed: list[str], gpu: str | None = None, before=lambda path: None
) -> Affected:
    """The :class:`Affected` of ``changed`` paths (relative to ``root``) on ``gpu``;
    ``before(path)``: a path's text at the base, or None."""
    deps = DependencyMap(root)
    auto = tuple(n for n, s in deps.table["backends"].items() if s.get("dispatches_to_every_backend"))
    effects = [deps.effect(p, before(p)) for p in changed]
    return Affected(base, list(changed), effects, gpu, auto, tuple(deps.backend_names))
