"""JSON Schemas of the gate's file formats (``schemas/*.schema.json``), validated with jsonschema:
the baseline (a pytest-benchmark run), the verdict, the A/A noise file and the selection
(:mod:`attnkit_perf.select`). A file that fails is a :class:`FormatError` naming the file, the
offending field and what was expected."""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path

import jsonschema


class FormatError(Exception):
    """A file the gate reads or writes does not have the expected format."""


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    text = resources.files("attnkit_perf.formats").joinpath(f"schemas/{kind}.schema.json").read_text()
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(kind: str, data, where: str) -> None:
    """Raise :class:`FormatError` if ``data`` does not match schema ``kind``: the message names
    the field, the value and the rule it breaks (jsonschema's words, e.g. "-100663296 is less
    than the minimum of 0"), and the benchmark it belongs to."""
    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(data))
    if error is not None:
        path = list(error.absolute_path)
        field = "/".join(str(p) for p in path) or "(top level)"
        benchmark = _benchmark_named(data, path)
        about = f" (benchmark {benchmark})" if benchmark else ""
        raise FormatError(f"{where} is not a valid {kind} file: at {field}: {error.message}{about}")


def _benchmark_named(data, path: list) -> str | None:
    """The name of the benchmark an error at ``path`` lies in: a list entry's ``name`` (in
    ``extra_info`` for a pytest-benchmark run, else its ``fullname``), or the key of a file
    whose benchmarks are keyed by name (the noise files)."""
    if len(path) < 2 or path[0] != "benchmarks":
        return None
    key = path[1]
    if isinstance(key, str):
        return key
    try:
        entry = data["benchmarks"][key]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(entry, dict):
        return None
    info = entry.get("extra_info")
    name = (
        (info.get("name") if isinstance(info, dict) else None) or entry.get("name") or entry.get("fullname")
    )
    return name if isinstance(name, str) else None


def read_json(path: Path | str, what: str) -> dict:
    """Parse a JSON file, or raise :class:`FormatError` saying why it cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{what} file {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{what} file {path} is not readable JSON ({err})") from err
