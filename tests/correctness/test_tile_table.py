"""Each entry of the Triton tile tables (``attnkit/triton/configs/<gpu>.json``, section
``families``), checked with the float64 oracle the way the calls of its shape family run it.

A family's entry sets the tiles, warps and stages of the forward and of the backward's two
passes for every Triton call of that family on that GPU. These tests run the three kernels with
the entry's config on shapes of the family that end inside the entry's blocks (queries, keys,
the causal diagonal and a window's edges), MHA and GQA, pointers and TMA descriptors,
outputs and gradients. On a GPU they run the entries of its own table (a call there reads
nothing else) and check that a call of the family reads that entry; under the interpreter (the
CPU) they run every table's entries.

The gate's selection keeps only these tests, for the changed entries, when a pull request changes
nothing but entries of a tile table (``tile_table_entry``: ``dependencies.json``, "entry_tests").
"""

from __future__ import annotations

import dataclasses
import json
import os
from functools import partial

import pytest
import torch
from conftest import DEVICE

import attnkit
from attnkit.testing import assert_close_to_reference, compare_to_reference
from attnkit.testing.strategies import AttentionCase

_UNAVAILABLE = (
    "triton is not installed"
    if "triton" not in attnkit.backend_names()
    else attnkit.unavailable_reason("triton", DEVICE)
)
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"triton on {DEVICE}: {_UNAVAILABLE}")

from attnkit.flash_autograd import flash_attention  # noqa: E402
from attnkit.inputs import check_inputs  # noqa: E402
from attnkit.triton import AttentionConfig, TritonImplementation, triton_attention  # noqa: E402
from attnkit.triton.config import CONFIG_DIR, CONFIG_ENV, get_config, table_key  # noqa: E402

#: This run's table: the GPU's own (its calls read no other), none under the interpreter.
_HERE = table_key(DEVICE) if DEVICE.type == "cuda" else None
_TMA_UNAVAILABLE = DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE)[0] != 9


def _entries() -> list:
    """``gpu:families/<family>`` of every committed table's entry, with its config: on a GPU,
    the other models' entries are skipped (they run on their GPU, and here under the interpreter)."""
    params = []
    for path in sorted(CONFIG_DIR.glob("*.json")):
        table = json.loads(path.read_text(encoding="utf8"))
        for family, entry in sorted(table.get("families", {}).items()):
            name = f"{path.stem}:families/{family}"
            marks = []
            if _HERE is not None and path.stem != _HERE:
                marks = [
                    pytest.mark.skip(reason=f"an entry of the {path.stem} table; this GPU reads {_HERE}'s")
                ]
            params.append(pytest.param(name, entry, marks=marks, id=name.replace(":families/", "-")))
    return params


@dataclasses.dataclass(frozen=True)
class Family:
    """A shape family as its key names it (:func:`attnkit.triton.config.family_key`)."""

    dtypes: tuple[torch.dtype, ...]
    dim: int
    causal: bool

    @classmethod
    def parse(cls, name: str) -> Family:
        width, dim, mode = name.rpartition("/")[2].split("-")
        dtypes = (torch.float32,) if width == "fp32" else (torch.bfloat16, torch.float16)
        return cls(dtypes, int(dim.removeprefix("d")), mode == "causal")


def _cases(family: Family, config: AttentionConfig) -> dict[str, tuple[AttentionCase, bool | None]]:
    """The calls of a family each entry is checked on, sized from the entry's largest block so
    that every kernel's loops end inside a block: name -> (case, TMA descriptors: True in every
    kernel, None each launcher's choice, as a call makes it)."""
    block = max(max(c.block_m, c.block_n) for c in (config.fwd, config.dkdv, config.dq))
    half, full = family.dtypes[0], family.dtypes[-1]
    # The family's head dim itself, and one that pads up to it (the masked head-dim loads).
    dim, narrow = family.dim, family.dim // 2 + 8
    window = (block + 9, -1) if family.causal else (block // 2 + 3, 17)
    case = partial(AttentionCase.make, causal=family.causal, seed=7)
    return {
        # More queries than keys (causal: rows past the keys' end), GQA, the launchers' choice.
        "gqa": (case(q_heads=4, kv_heads=2, q_len=2 * block + 19, kv_len=2 * block - 13, head_dim=dim,
                     dtype=half), None),
        # Fewer queries than keys, every kernel through TMA (zero fill instead of masks).
        "tma": (case(q_heads=2, kv_heads=2, q_len=block + 37, kv_len=2 * block + 5, head_dim=dim,
                     value_dim=narrow, dtype=full), True),
        # A window whose edges fall inside blocks, on (B, N, H, D) strides and a padded head dim.
        "window": (case(q_heads=2, kv_heads=1, q_len=3 * block + 7, kv_len=3 * block + 7, head_dim=narrow,
                        value_dim=dim, dtype=half, window=window, q_layout="bnhd", kv_layout="bnhd"), None),
    }  # fmt: skip


@pytest.mark.parametrize("case_name", ["gqa", "tma", "window"])
@pytest.mark.parametrize(("tile_table_entry", "entry"), _entries())
def test_each_entry_matches_the_oracle_on_shapes_of_its_family(tile_table_entry, entry, case_name):
    family = Family.parse(tile_table_entry)
    config = AttentionConfig.from_dict(entry)
    case, tma = _cases(family, config)[case_name]
    if tma and _TMA_UNAVAILABLE:
        pytest.skip("TMA descriptors need a Hopper GPU or the interpreter")
    q, k, v, grad_out = case.tensors(DEVICE)

    def run(a, b, c):
        problem = check_inputs(a, b, c, family.causal, None, case.window)
        if tma is None:
            return triton_attention(a, b, c, problem, config)
        return flash_attention(TritonImplementation(config, tma=tma), a, b, c, problem)

    checks = compare_to_reference(run, q, k, v, grad_out=grad_out, **case.kwargs)
    label = f"triton with {tile_table_entry} ({config}) on {case_name}: {case.problem.describe()}"
    assert_close_to_reference(label, checks)


@pytest.mark.skipif(_HERE is None, reason="a GPU's calls read its table; under the interpreter, none")
@pytest.mark.skipif(bool(os.environ.get(CONFIG_ENV)), reason=f"{CONFIG_ENV} names the table calls read")
@pytest.mark.parametrize(("tile_table_entry", "entry"), _entries())
def test_a_call_of_the_family_reads_its_entry(tile_table_entry, entry):
    """What the test above checks is what a call runs: a call of the family, on this GPU, reads
    this entry (no override, no fallback to the default tiles)."""
    family = Family.parse(tile_table_entry)
    for dtype in family.dtypes:
        for head_dim, value_dim in ((family.dim, family.dim), (family.dim // 2 + 8, family.dim)):
            found = get_config(DEVICE, dtype, head_dim, value_dim, family.causal)
            assert found == AttentionConfig.from_dict(entry), (
                f"a {dtype} call with D={head_dim}, Dv={value_dim}, causal={family.causal} reads {found}, "
                f"not {tile_table_entry}'s {entry}"
            )
