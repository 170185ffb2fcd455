"""What a diff can affect: each changed file's effect, from the symbol graph of the library
(:mod:`attnkit_perf.select.symbols`) and the declared dependencies (``dependencies.json``: the
backends' roots, shared code, data files and who reads them, files that affect nothing).

A file's effect is one of

* ``everything``: shared code, the gate, the tests' configuration, dependencies, or a file no
  rule maps (a new module no backend reaches yet, a deleted or renamed module, anything unknown);
* ``backends``: the backends whose code reaches it, each with the passes it can change: ``all``,
  or ``backward`` when only a gradient's code reaches it (rows timing a backward);
  a GPU-keyed table (``{gpu}`` in its path) only on that GPU model, and of its sections only
  the rows reading a changed entry or one the library's reader refuses
  (:mod:`~attnkit_perf.select.tables`): where the reader reads one entry per row (Triton's
  shape families) that entry's rows, where it parses every entry (the Gluon section's cells)
  every row of that reader; a table whose declared parts reach every GPU model's correctness
  tests (routed Gluon cells: Triton's dispatch boundaries) runs those tests on any model;
* ``correctness``: an entry point no perf row calls (the correctness tests importing it run), or
  a correctness test module (it runs);
* ``nothing``: documentation and the CPU job's own tests; a table whose changes lie only in
  parts no reader reads (provenance, the tuner's record).
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import importlib
import json
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from attnkit_perf.select.symbols import SymbolGraph

DEPENDENCIES = Path(__file__).with_name("dependencies.json")
#: The selection file's format (:meth:`Affected.to_dict`, ``selection.schema.json``).
FORMAT = "attnkit-selection/1"
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
    #: a GPU-keyed table whose change reaches the backends' correctness tests on every GPU model
    #: (perf rows only on ``gpu``)
    tests_every_gpu: bool = False
    #: the table entries whose content changed, as ``section/name`` (e.g.
    #: ``families/16bit-d128-causal``, ``gluon/backward/d64-full``), where the readers look up one
    #: entry per row; None: any row may read a changed part
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

    def gpu_keys(self) -> set[str]:
        """The GPU models the checkout holds data of: the ``{gpu}`` part of every file the
        declared GPU-keyed paths match (tile tables, auto tables, baselines)."""
        keys = set()
        for entry in self.table["data"]:
            for pattern in entry["paths"]:
                if "{gpu}" not in pattern:
                    continue
                matcher = _glob(pattern)
                for path in self.root.glob(pattern.replace("{gpu}", "*")):
                    found = matcher.match(path.relative_to(self.root).as_posix())
                    if found:
                        keys.add(found["gpu"])
        return keys

    def dispatch_targets(self, gpu: str | None) -> dict[str, tuple[str, ...] | None]:
        """dispatcher -> the backends it may run on GPU model ``gpu`` (None: any model), for
        each backend entry that ``dispatches_to`` (``auto``): the names its ``fallback`` function
        returns (the library's registry, as this process imports it: the backends that declare
        an auto rank) and the paths its ``tables`` (the checkout's, of ``gpu`` or of every model)
        measured, read by its ``read_with`` function. None: any backend, where a table cannot
        be read (a run would refuse it; every row of the dispatcher's runs anyway, as the
        table's own effect)."""
        found = {}
        for name, spec in self.table["backends"].items():
            targets = spec.get("dispatches_to")
            if targets is None:
                continue
            names = set(_function(targets["fallback"])())
            read = _function(targets["read_with"])
            for path in sorted(self.root.glob(targets["tables"].replace("{gpu}", gpu or "*"))):
                try:
                    names |= read(json.loads(path.read_text(encoding="utf8")), str(path))
                except Exception:  # the library refuses it: any path may be meant
                    names = None
                    break
            found[name] = None if names is None else tuple(sorted(names))
        return found

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
                    refused = self._refused(entry, path)
                    if entry.get("entries"):
                        return self._entries_effect(effect, entry, before, refused)
                    if refused:
                        why = "; ".join(f"{part}: {why}" for part, why in sorted(refused.items()))
                        effect = dataclasses.replace(
                            effect, why=f"{effect.why}; the library refuses it: {why}"
                        )
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

    @property
    def entry_rules(self) -> dict[str, dict]:
        """section -> which rows read its entries (``rows``: ``family`` or ``cell``; ``passes``:
        ``all`` or ``backward``; ``every_gpu``), over the tables read entry by entry."""
        return {name: rule for entry in self.table["data"] for name, rule in entry.get("entries", {}).items()}

    def _refused(self, entry: dict, path: str) -> dict[str, str] | None:
        """What the library's reader (the entry's ``read_with``,
        :mod:`attnkit_perf.select.tables`) refuses in the table at ``path`` as the working tree
        has it: ``{part: why}``, ``{"*": why}`` when it is not JSON; None: no such file (deleted)
        or no reader declared."""
        reader = entry.get("read_with")
        file = self.root / path
        if reader is None or not file.is_file():
            return None
        try:
            table = json.loads(file.read_text(encoding="utf8"))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            return {"*": f"not readable JSON ({err})"}
        return _function(reader)(table, path)

    def _entries_effect(
        self, effect: Effect, entry: dict, before: str | None, refused: dict | None
    ) -> Effect:
        """``effect`` narrowed to the table entries that differ from the base's text (``before``;
        None: the table is new, or its base unknown: every entry counts as changed) or that the
        library's reader refuses (``refused``, :meth:`_refused`); where a section's reader parses
        every entry (``reads: every``), any of them counts as all of them (``section/*``)."""
        sections = entry["entries"]
        changed = None
        if before is not None:
            changed = _changed_entries(before, self.root / effect.path, sections, entry.get("unread", ()))
        refused = refused or {}
        if changed == () and not refused:
            return Effect(effect.path, "nothing", f"only what no reader reads changed: {entry['unread_why']}")
        why = effect.why
        if refused:
            why += "; the library refuses " + "; ".join(f"{part}: {r}" for part, r in sorted(refused.items()))
        if changed is None or "*" in refused:
            every_gpu = any(rule.get("every_gpu") for rule in sections.values())
            return dataclasses.replace(effect, why=why, entries=None, tests_every_gpu=every_gpu)
        parts = set(changed) | set(refused)
        whole = {s for s, rule in sections.items() if rule.get("reads") == "every"}
        parts = {f"{s}/*" if s in whole else p for p in parts for s in [p.rpartition("/")[0]]}
        every_gpu = any(sections[part.rpartition("/")[0]].get("every_gpu") for part in parts)
        return dataclasses.replace(effect, why=why, entries=tuple(sorted(parts)), tests_every_gpu=every_gpu)

    def _data_effect(self, path: str, entry: dict, gpu: str | None) -> Effect:
        if entry.get("every_backend"):
            return Effect(path, "backends", entry["why"], dict.fromkeys(self.backend_names, "all"), gpu)
        readers = entry["read_by"] if isinstance(entry["read_by"], list) else [entry["read_by"]]
        reader = [node for r in readers for node in self.graph.resolve(*r.split(":"))]
        backends = {}
        for name, spec in self.table["backends"].items():
            spec = self.table["backends"].get(spec.get("same_as"), spec)
            roots = [n for r in spec["roots"] for n in self.graph.resolve(*r.split(":"))]
            if set(reader) & self.graph.closure(roots, backward=False):
                backends[name] = "all"
            elif set(reader) & self.graph.closure(roots, backward=True):
                backends[name] = "backward"
        return Effect(path, "backends", f"{entry['why']} (read by {', '.join(readers)})", backends, gpu)

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


def _function(qualified: str):
    """The function ``module:name`` names in ``dependencies.json``."""
    module, _, name = qualified.partition(":")
    return getattr(importlib.import_module(module), name)


def _changed_entries(before: str, after: Path, sections, unread=()) -> tuple | None:
    """``section/name`` of each entry of ``sections`` (slash-separated key paths, e.g.
    ``gluon/backward``; a section absent on one side counts as empty) that differs between the
    JSON texts; None when either side does not read as such a table or a part of it outside
    those sections and the ``unread`` key paths differs (then every entry counts as changed)."""
    try:
        old = json.loads(before)
        new = json.loads(after.read_text(encoding="utf8"))
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    changed = []
    for section in sections:
        old_entries, new_entries = _take(old, section), _take(new, section)
        if not isinstance(old_entries, dict) or not isinstance(new_entries, dict):
            return None
        names = old_entries.keys() | new_entries.keys()
        changed += [f"{section}/{n}" for n in names if old_entries.get(n) != new_entries.get(n)]
    for path in unread:
        _take(old, path), _take(new, path)
    if old != new:  # what is left once the sections and the unread parts are taken out
        return None
    return tuple(sorted(changed))


def _take(table: dict, path: str):
    """Remove and return the value at a slash-separated key path of nested dicts ({} if absent),
    emptied containers left behind."""
    *parents, last = path.split("/")
    node = table
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    return node.pop(last, {}) if isinstance(node, dict) else {}


def reads_entry(rule: dict, name: str, case) -> bool:
    """Whether a perf ``case`` reads the table entry ``name`` (its section's ``rule``; ``*``:
    every entry of the section, read by one reader)."""
    if rule.get("passes") == "backward" and case.pass_name not in BACKWARD_PASSES:
        return False
    if name == "*":
        return True
    if rule["rows"] == "family":
        return name == tile_family(case)
    if rule["rows"] == "cell":  # attnkit.triton.gluon.config.cell_key, either causal mode
        return name.startswith(f"d{case.head_dim}-")
    raise ValueError(f"dependencies.json: entry rows {rule['rows']!r}: expected 'family' or 'cell'")


def tile_family(case) -> str:
    """The Triton shape family whose entry a perf case's calls read
    (:func:`attnkit.triton.config.family_key` of the case's problem: dtype class, padded head
    dim, causal or not)."""
    from attnkit.triton.config import family_key

    p = case.problem
    return family_key(p.dtype, p.head_dim, p.value_dim, p.causal)


@dataclass
class Affected:
    """The effects of a diff's files, for a run on GPU model ``gpu`` (None: any)."""

    base: str
    changed: list[str]
    effects: list[Effect]
    gpu: str | None = None
    #: dispatcher (``auto``) -> the backends it may run on this GPU model, None: any
    #: (:meth:`DependencyMap.dispatch_targets`); a change reaching one of them reaches its rows
    dispatchers: dict = field(default_factory=lambda: {"auto": None})
    #: the backends the map knows; any other (a plugin's) is never deselected: its code is not mapped
    known: tuple | None = None
    #: section -> which rows read its entries (:attr:`DependencyMap.entry_rules`)
    entry_rules: dict = field(default_factory=dict)

    def applies(self, effect: Effect, tests: bool = False) -> bool:
        """Whether ``effect`` holds on this run's GPU model (``tests``: for correctness tests)."""
        if effect.gpu is None or self.gpu is None or effect.gpu == self.gpu:
            return True
        return tests and effect.tests_every_gpu

    @property
    def everything(self) -> list[Effect]:
        return [e for e in self.effects if e.kind == "everything"]

    @property
    def backends(self) -> dict[str, str]:
        """backend -> "all" | "backward", over the effects that apply here (perf rows)."""
        return self._backends(tests=False)

    @property
    def test_backends(self) -> dict[str, str]:
        """The same for correctness tests (a table's effect on every GPU model's tests counted)."""
        return self._backends(tests=True)

    def _backends(self, tests: bool) -> dict[str, str]:
        merged: dict[str, str] = {}
        for effect in self.effects:
            if effect.kind != "backends" or not self.applies(effect, tests):
                continue
            for name, passes in effect.backends.items():
                merged[name] = "all" if "all" in (passes, merged.get(name)) else "backward"
        reached = {
            name: [p for b, p in merged.items() if b == name or self._dispatches(name, b)]
            for name in self.dispatchers
        }
        for name, passes in reached.items():
            if passes:
                merged[name] = "all" if "all" in passes else "backward"
        return merged

    def _dispatches(self, dispatcher: str, backend: str) -> bool:
        """Whether ``dispatcher`` (``auto``) may run ``backend`` here."""
        targets = self.dispatchers[dispatcher]
        return backend != dispatcher and (targets is None or backend in targets)

    def _effects_on(self, backend: str, tests: bool = False) -> list[Effect]:
        """The backend effects that apply here and reach ``backend``: its own, and for a
        dispatcher (``auto``) those of the backends it may run."""
        return [
            effect
            for effect in self.effects
            if effect.kind == "backends"
            and self.applies(effect, tests)
            and (
                backend in effect.backends
                or (
                    backend in self.dispatchers and any(self._dispatches(backend, b) for b in effect.backends)
                )
            )
        ]

    def entries(self, backend: str) -> set[str] | None:
        """The table entries (``section/name``) the diff changed for ``backend`` where every
        effect on it is such a table's, else None (any row of it may be affected). ``auto``'s
        rows read what the backends it dispatches to read: their effects count for them."""
        effects = self._effects_on(backend)
        if not effects or any(e.entries is None for e in effects):
            return None
        return {entry for e in effects for entry in e.entries}

    def entry_tests(self, backend: str) -> dict[str, set[str]] | None:
        """Where every effect on ``backend``'s correctness tests is a change of table entries
        whose section has tests of its own, entry by entry (its rule's ``entry_tests``: the
        pytest parameter naming an entry as ``gpu:section/name``): parameter -> the changed
        entries, which those tests check in place of the backend's whole suite. Else None."""
        effects = self._effects_on(backend, tests=True)
        if not effects or any(e.entries is None for e in effects):
            return None
        found: dict[str, set[str]] = {}
        for effect in effects:
            for entry in effect.entries:
                section, _, name = entry.rpartition("/")
                param = self.entry_rules.get(section, {}).get("entry_tests")
                if param is None or name == "*":
                    return None
                found.setdefault(param, set()).add(f"{effect.gpu}:{entry}")
        return found or None

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
        entries = self.entries(backend) if case is not None else None
        if entries is not None:
            rules = {name: self.entry_rules[name.rpartition("/")[0]] for name in entries}
            if not any(reads_entry(rule, name.rpartition("/")[2], case) for name, rule in rules.items()):
                changed = ", ".join(sorted(entries)) or "none"
                return (
                    f"backend {backend}: its tables changed {changed}, none read by a "
                    f"{tile_family(case)} {case.pass_name} row"
                )
        return None

    def to_dict(self) -> dict:
        """The selection file (``python -m attnkit_perf.select --json-out``; format
        :data:`FORMAT`): the decision and everything :meth:`from_dict` needs to apply it."""
        return {
            "format": FORMAT,
            "base": self.base,
            "gpu": self.gpu,
            "everything": bool(self.everything),
            "backends": self.backends,
            "changed": [_effect_dict(e) for e in self.effects],
            "dispatchers": {
                name: None if targets is None else list(targets) for name, targets in self.dispatchers.items()
            },
            "known": None if self.known is None else list(self.known),
            "entry_rules": self.entry_rules,
        }

    @classmethod
    def from_dict(cls, data: dict, gpu: str | None = None) -> Affected:
        """The decision :meth:`to_dict` wrote (validated against the selection schema by the
        caller), for a run on GPU model ``gpu``: a file written for any model (``gpu`` null)
        takes the run's; one written for another model is refused (:class:`ValueError`)."""
        written = data.get("gpu")
        if written is not None and gpu is not None and written != gpu:
            raise ValueError(f"the selection was made for GPU model {written!r}; this run is on {gpu!r}")
        effects = [
            Effect(**{**e, "entries": None if e.get("entries") is None else tuple(e["entries"])})
            for e in data["changed"]
        ]
        known = data.get("known")
        dispatchers = {n: None if t is None else tuple(t) for n, t in data["dispatchers"].items()}
        return cls(
            data["base"],
            [e.path for e in effects],
            effects,
            written or gpu,
            dispatchers,
            None if known is None else tuple(known),
            dict(data.get("entry_rules", {})),
        )

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
    effects = [deps.effect(p, before(p)) for p in changed]
    dispatchers = deps.dispatch_targets(gpu)
    return Affected(
        base, list(changed), effects, gpu, dispatchers, tuple(deps.backend_names), deps.entry_rules
    )


def _effect_dict(effect: Effect) -> dict:
    """An effect as the selection file holds it: JSON's types (its entries an array)."""
    data = asdict(effect)
    if data.get("entries") is not None:
        data["entries"] = list(data["entries"])
    return data
