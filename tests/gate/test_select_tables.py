"""A changed table read with the library's own readers (attnkit_perf.select.tables): a table
the library refuses runs every row of the refusing reader, a reader that parses every entry of
its section runs every row of its consumers, and a reader of one entry per call still narrows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from attnkit_perf.measure.cases import gpu_suite_cases
from attnkit_perf.select import tables
from attnkit_perf.select.rules import DependencyMap, affected

ROOT = Path(__file__).resolve().parents[2]
H200, H100 = "nvidia-h200", "nvidia-h100-80gb-hbm3"
TILE_TABLE = f"src/attnkit/triton/configs/{H200}.json"
AUTO_TABLE = f"src/attnkit/auto_tables/{H200}.json"


def _table(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _invalid_gluon_cell(table: dict) -> dict:
    """The forward cell d64-full with pingpong and 3 consumers (pingpong takes 2)."""
    table["gluon"]["forward"]["d64-full"].update(pingpong=True, consumers=3)
    return table


@pytest.fixture
def tree(tmp_path):
    """A copy of the library's source: ``plant(path, table)`` writes a table into it and returns
    the rows a diff of that table against the committed one runs on ``gpu``, and its effect."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))

    def plant(path: str, table: dict, gpu: str = H200):
        (tmp_path / path).write_text(json.dumps(table))
        before = (ROOT / path).read_text()
        decision = affected(tmp_path, "base", [path], gpu, before=lambda p: before if p == path else None)
        ran = {c for c in gpu_suite_cases() if decision.row_skip(c.backend, c.pass_name, c) is None}
        return ran, decision.effects[0]

    return plant


PACKAGED = [
    *((p, tables.tile_table) for p in sorted(ROOT.glob("src/attnkit/triton/configs/*.json"))),
    *((p, tables.auto_table) for p in sorted(ROOT.glob("src/attnkit/auto_tables/*.json"))),
]


@pytest.mark.parametrize(("path", "reader"), PACKAGED, ids=[f"{p.parent.name}/{p.stem}" for p, _ in PACKAGED])
def test_every_packaged_table_reads(path, reader):
    """The packaged tables are what the library reads without complaint (the baseline of the
    checks below: a refusal is the change's, not the table's)."""
    assert len(PACKAGED) >= 4
    assert reader(json.loads(path.read_text()), str(path)) == {}


def test_an_invalid_gluon_cell_is_refused_by_the_reader_of_every_forward_cell():
    refused = tables.tile_table(_invalid_gluon_cell(_table(TILE_TABLE)), TILE_TABLE)
    assert set(refused) == {"gluon/forward/*"}
    assert "pingpong" in refused["gluon/forward/*"] and "3 consumers" in refused["gluon/forward/*"]


def test_an_invalid_gluon_cell_runs_every_row_that_reads_the_gluon_forward(tree):
    """forward_configs parses every forward cell, so each Gluon forward of that GPU raises: every
    Triton row (and auto's) of that GPU model runs, not only the changed cell's head dim."""
    ran, effect = tree(TILE_TABLE, _invalid_gluon_cell(_table(TILE_TABLE)))
    every = {c for c in gpu_suite_cases() if c.backend in ("triton", "auto")}
    assert ran == every and {c.head_dim for c in ran} >= {64, 128}
    assert effect.entries == ("gluon/forward/*",)
    assert "refuses gluon/forward/*" in effect.why and "pingpong" in effect.why
    other_gpu, _ = tree(TILE_TABLE, _invalid_gluon_cell(_table(TILE_TABLE)), gpu=H100)
    assert other_gpu == set(), "the table of one GPU model: no row of another runs"


def test_an_invalid_routed_cell_runs_every_row_and_the_tests_of_every_gpu(tree):
    """routed_cells parses every routed cell, on every GPU model at import (Triton's dispatch
    boundaries): every Triton row of the table's GPU, and Triton's tests on any model."""
    table = _table(TILE_TABLE)
    table["gluon"]["routed"]["forward"]["d64-full"] = "soon"
    ran, effect = tree(TILE_TABLE, table)
    assert ran == {c for c in gpu_suite_cases() if c.backend in ("triton", "auto")}
    assert effect.tests_every_gpu and "gluon/routed/forward/*" in effect.entries


def test_a_valid_changed_family_still_runs_only_its_rows(tree):
    """get_config reads one family per call: a valid retuned family reaches the rows of that
    family only (D=64, not causal, here: no D=128 row, so no auto row)."""
    table = _table(TILE_TABLE)
    table["families"]["16bit-d64-full"]["fwd"]["num_warps"] = 8
    ran, effect = tree(TILE_TABLE, table)
    assert effect.entries == ("families/16bit-d64-full",)
    assert ran and {(c.backend, c.head_dim) for c in ran} == {("triton", 64)}
    family = {c for c in gpu_suite_cases() if c.backend == "triton" and c.head_dim == 64 and not c.causal}
    assert ran == family


def test_an_invalid_family_runs_the_rows_of_that_family(tree):
    """A family the library refuses raises only where it is read: the rows of that family."""
    table = _table(TILE_TABLE)
    table["families"]["16bit-d128-causal"]["fwd"]["block_m"] = 24
    ran, effect = tree(TILE_TABLE, table)
    assert "families/16bit-d128-causal" in effect.why and "block_m" in effect.why
    family = {c for c in gpu_suite_cases() if c.backend in ("triton", "auto") and c.head_dim == 128}
    family = {c for c in family if c.causal}
    assert ran == family


def test_an_invalid_auto_table_runs_the_auto_rows_and_says_why(tree):
    table = _table(AUTO_TABLE)
    table["cells"][0]["pass"] = "bwd"
    ran, effect = tree(AUTO_TABLE, table)
    assert ran == {c for c in gpu_suite_cases() if c.backend == "auto"}
    assert "the library refuses it" in effect.why and "pass must be one of" in effect.why


def test_a_path_an_auto_table_measured_is_one_auto_may_run_on_that_gpu_model(tmp_path):
    """A table that measured flex makes a change to flex reach auto's rows on its GPU model, not
    on another; a table the library refuses makes any backend's change reach them."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    flex = ["src/attnkit/flex.py"]
    assert affected(tmp_path, "base", flex, H200).backends == {"flex": "all"}
    table = _table(AUTO_TABLE)
    table["cells"][0]["ms"]["flex"] = 0.001
    (tmp_path / AUTO_TABLE).write_text(json.dumps(table))
    assert affected(tmp_path, "base", flex, H200).backends == {"flex": "all", "auto": "all"}
    assert affected(tmp_path, "base", flex, H100).backends == {"flex": "all"}
    table["cells"][0]["pass"] = "bwd"
    (tmp_path / AUTO_TABLE).write_text(json.dumps(table))
    assert DependencyMap(tmp_path).dispatch_targets(H200) == {"auto": None}
    assert affected(tmp_path, "base", flex, H200).backends == {"flex": "all", "auto": "all"}


class _Recording(dict):
    """A section whose entries note each key the library reads."""

    def __init__(self, entries: dict, read: set) -> None:
        super().__init__(entries)
        self.read = read

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self:
            self.read.add(key)
        return super().get(key, default)

    def items(self):
        self.read.update(self.keys())
        return super().items()

    def values(self):
        self.read.update(self.keys())
        return super().values()


def test_the_declared_reads_are_what_the_library_reads_for_one_row(monkeypatch):
    """dependencies.json says, per section, whether the library reads one entry for a row
    (``reads: one``) or parses every entry to read one (``every``): one row's lookups through the
    library's run-time paths, on a table whose sections note what is read, show which."""
    from attnkit.triton import config as triton_config
    from attnkit.triton.gluon import config as gluon_config

    rules = DependencyMap(ROOT).entry_rules
    table = _table(TILE_TABLE)
    read: dict[str, set] = {}
    for section in rules:
        *parents, last = section.split("/")
        node = table
        for key in parents:
            node = node[key]
        node[last] = _Recording(node[last], read.setdefault(section, set()))
    monkeypatch.setattr(triton_config, "table_path", lambda device: Path("planted.json"))
    monkeypatch.setattr(triton_config, "load_table", lambda path: table)
    monkeypatch.setattr(gluon_config, "device_section", lambda device: table["gluon"])
    # One row's reads (D=128, causal, bf16), as the Triton path makes them on a GPU.
    triton_config._lookup_config.__wrapped__(0, None, torch.bfloat16, 128, 128, True)
    gluon_config._forward_config.__wrapped__(0, None, 128, True)
    gluon_config._backward_config.__wrapped__(0, None, 128, True)
    for pass_name in gluon_config.PASSES:  # attnkit.triton.gluon.route
        gluon_config.routed_cells(gluon_config.device_section(None), pass_name)
    for section, rule in rules.items():
        entries = set(_take(_table(TILE_TABLE), section))
        if rule["reads"] == "every":
            assert read[section] == entries, section
        else:
            assert rule["reads"] == "one" and len(read[section]) == 1 < len(entries), (section, read[section])


def _take(table: dict, section: str) -> dict:
    for key in section.split("/"):
        table = table[key]
    return table
