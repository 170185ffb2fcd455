"""The pytest side of selection: which collected items a diff can affect, deselected through
pytest's own mechanism (``pytest_deselected``: they count as "deselected"), with one summary line
per reason.

* Perf rows (items using the ``attnkit_perf`` fixture): kept when the diff reaches their
  backend's code for the pass they time (:meth:`attnkit_perf.select.rules.Affected.row_skip`).
* Correctness tests: a test is kept when its module is changed, or when the code its module
  imports (and what that runs) holds a changed file that is not one backend's code (a KV-cache
  change keeps every backend's KV-cache tests). Past that, a test parametrized over a backend
  (``backend`` / ``attnkit_backend``) is kept when that backend is affected: a backend parameter
  narrows only a change to backend code. Any other test is kept when its module names or
  imports the code of an affected backend, or imports a changed file. Tests that reach no
  backend (the backend-independent ones) run only when shared code changed. When all a diff
  changed of a backend is table entries that have tests of their own (the Triton tile tables'
  families, ``tests/correctness/test_tile_table.py``), only those tests run, for the changed
  entries (:meth:`~attnkit_perf.select.rules.Affected.entry_tests`).

The decision is made once per run: read from the selection file (:func:`read_selection`, written
by ``python -m attnkit_perf.select --json-out``), or computed by :func:`decide` in pytest's
controller process and handed to xdist's workers as data.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from attnkit_perf.formats.schema import FormatError, read_json, validate
from attnkit_perf.select.changes import ChangesError, changed_files, text_at
from attnkit_perf.select.rules import Affected, DependencyMap, affected

#: ``--attnkit-select`` values.
CHOICES = ("affected", "all")
_BACKEND_PARAMS = ("backend", "attnkit_backend")


def decide(root: Path, base: str, gpu: str | None) -> Affected | str:
    """The diff between ``base`` and the working tree at ``root``, decided; or, when git cannot
    list it, why (then everything runs: selection never guesses)."""
    try:
        changed = changed_files(root, base)
    except ChangesError as err:
        return f"cannot list the changes since {base} ({err}): everything runs"
    return affected(root, base, changed, gpu, lambda path: text_at(root, base, path))


def read_selection(path: Path | str, gpu: str | None) -> Affected:
    """The decision in the selection file at ``path``, for a run on GPU model ``gpu``; a file
    that is missing, not of the selection format, or made for another GPU model is a
    :class:`~attnkit_perf.formats.schema.FormatError` saying so."""
    data = read_json(path, "selection")
    validate("selection", data, f"selection file {path}")
    try:
        return Affected.from_dict(data, gpu)
    except ValueError as err:
        raise FormatError(f"selection file {path}: {err}") from err


def deselect(config: pytest.Config, items: list, decision: Affected, rows: dict) -> dict:
    """Deselect the ``items`` the decision leaves out; ``rows``: perf case name -> its
    :class:`~attnkit_perf.measure.cases.BenchCase`. Returns the selection's record (for the
    verdict): the decision, how many items were kept, and per reason how many were skipped."""
    deps = DependencyMap(Path(config.rootpath))
    modules: dict[str, tuple[set, set]] = {}
    kept, dropped, reasons = [], [], Counter()
    changed = set(decision.changed)
    affected_backends = decision.backends
    for item in items:
        reason = None if decision.everything else _skip(item, decision, rows, deps, modules, changed)
        if reason is None:
            kept.append(item)
        else:
            dropped.append(item)
            reasons[reason] += 1
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    lines = [f"{n} deselected: {why}" for why, n in sorted(reasons.items())]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        head = decision.describe()[0]
        reporter.write_line(f"attnkit select (changes since {decision.base}): {head}")
        for line in lines:
            reporter.write_line(f"attnkit select: {line}")
    return {
        **decision.to_dict(),
        "backends": affected_backends,
        "selected": len(kept),
        "skipped": [{"reason": why, "count": n} for why, n in sorted(reasons.items())],
    }


def _skip(item, decision: Affected, rows: dict, deps: DependencyMap, modules: dict, changed: set):
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = rows.get(params.get("case")) if "attnkit_perf" in getattr(item, "fixturenames", ()) else None
    if case is not None:
        return decision.row_skip(case.backend, case.pass_name, case)
    path = Path(str(item.path))
    try:
        relative = path.resolve().relative_to(Path(item.config.rootpath).resolve()).as_posix()
    except ValueError:
        return None  # outside the repository (an installed suite): not selected out
    if relative in changed:
        return None
    if relative not in modules:
        source = path.read_text(encoding="utf8")
        modules[relative] = (deps.test_backends(source), deps.test_imports(source))
    backends, imports = modules[relative]
    reached = imports & changed
    backend_code = {e.path for e in decision.effects if e.kind == "backends"}
    if reached - backend_code:
        return None  # the module runs changed code that is no backend's: each backend's test runs it
    backend = next((params[p] for p in _BACKEND_PARAMS if p in params), None)
    if backend is not None:
        if backend not in deps.backend_names:
            return None  # a plugin's backend: no map of its code, so it runs
        if backend not in decision.test_backends:
            return f"tests of backend {backend}: no changed file reaches its code"
        return _entry_skip(params, {backend}, decision)
    if reached:
        return None
    if backends & set(decision.test_backends):
        return _entry_skip(params, backends & set(decision.test_backends), decision)
    if not backends:
        return "backend-independent tests: no shared code changed"
    return f"tests of {', '.join(sorted(backends))}: no changed file reaches their code"


def _entry_skip(params: dict, backends: set, decision: Affected) -> str | None:
    """Why a test the diff reaches through ``backends`` need not run when the diff changed
    only their table entries that have tests of their own (:meth:`Affected.entry_tests`): those
    tests run for the changed entries, and the backends' other tests do not. None: it runs."""
    wanted: dict[str, set[str]] = {}
    for name in sorted(backends):
        narrowed = decision.entry_tests(name)
        if narrowed is None:
            return None  # a change of code, or of an entry without tests of its own
        for param, entries in narrowed.items():
            wanted.setdefault(param, set()).update(entries)
    for param, entries in wanted.items():
        if param in params:
            return None if params[param] in entries else "tests of table entries that did not change"
    changed = ", ".join(sorted(e for entries in wanted.values() for e in entries))
    names = ", ".join(sorted(backends))
    return f"tests of {names}: only table entries changed ({changed}), which their own tests check"
