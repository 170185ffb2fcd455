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
    text = resources.files("attnkit_perf.decide").joinpath(f"schemas/{kind}.schema.json").read_text()
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(kind: str, data, where: str) -> None:
    """Raise :class:`FormatError` if ``data`` does not match schema ``kind``."""
    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(data))
    if error is not None:
        field = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise FormatError(f"{where} is not a valid {kind} file: at {field}: {error.message}")


def read_json(path: Path | str, what: str) -> dict:
    """Parse a JSON file, or raise :class:`FormatError` saying why it cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{what} file {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{what} file {path} is not readable JSON ({err})") from err
