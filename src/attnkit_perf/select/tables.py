"""A changed table read with the library's own readers, as a run would read it: what a selection
must know before it narrows a table's change to the rows that read its changed entries.

Each function takes a table (parsed JSON) and returns what the library refuses in it, as
``{part: why}``: ``section/name`` where the library reads the section one entry per call (only the
rows of that entry raise), ``section/*`` where one reader parses the whole section (an invalid cell
makes every row of that reader raise, as :func:`attnkit.triton.gluon.config.forward_configs`
parses every forward cell), ``*`` for the table as a whole. ``dependencies.json`` names the
function of each table (``read_with``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def _refusal(read: Callable[[], object]) -> str | None:
    """Why ``read`` raised (any exception: a reader refuses data by raising), or None."""
    try:
        read()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


def tile_table(table: Mapping, source: str) -> dict[str, str]:
    """A Triton tile table (``attnkit/triton/configs/<gpu>.json``) with its Gluon section:
    :func:`attnkit.triton.config.load_table`'s check of the table, one
    :class:`~attnkit.triton.config.AttentionConfig` per family (a call reads its own family),
    and the Gluon section's readers, each of which parses every cell of its part."""
    from attnkit.triton.config import AttentionConfig
    from attnkit.triton.gluon.config import (
        PASSES,
        backward_configs,
        forward_configs,
        routed_cells,
        section_of,
    )

    if not isinstance(table, Mapping) or not isinstance(table.get("families"), Mapping):
        return {"*": f"{source}: not a kernel-config table (no 'families' object)"}
    refused = {}
    for name, entry in table["families"].items():
        why = _refusal(lambda entry=entry: AttentionConfig.from_dict(entry))
        if why:
            refused[f"families/{name}"] = why
    gluon = section_of(table)
    readers = {"gluon/forward": forward_configs, "gluon/backward": backward_configs}
    readers |= {f"gluon/routed/{p}": (lambda s, p=p: routed_cells(s, p)) for p in PASSES}
    for part, reader in readers.items():
        why = _refusal(lambda reader=reader: reader(gluon))
        if why:
            refused[f"{part}/*"] = why
    return refused


def auto_table(table: Mapping, source: str) -> dict[str, str]:
    """An auto table (``attnkit/auto_tables/<gpu>.json``): :class:`attnkit.auto.AutoTable` reads
    every cell when it loads the table."""
    from attnkit.auto import AutoTable

    why = _refusal(lambda: AutoTable(table, source))
    return {"*": why} if why else {}


def auto_table_paths(table: Mapping, source: str) -> set[str]:
    """The paths an auto table measured, which ``auto`` may then run on its GPU model (as
    :class:`attnkit.auto.AutoTable` reads them; a table it refuses raises)."""
    from attnkit.auto import AutoTable

    return set(AutoTable(table, source).paths)
