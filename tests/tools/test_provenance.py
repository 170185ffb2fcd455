"""attnkit_tools.pages.provenance: a page's command and provenance name no scratch path of the machine
that produced it."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnkit_tools.pages.provenance import produced_by, provenance_table, public_path, restated


def test_the_command_names_scratch_files_by_their_name_and_keeps_repository_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    inside = str(Path(tmp_path) / "docs" / "PER_CALL.md")
    command = produced_by(
        "pages.per_call", ["--out", "/tmp/w/per_call.json", "--md", inside, "--doc=/scratch/a/Y.md"]
    )
    assert command == (
        "python -m attnkit_tools.pages.per_call --out per_call.json --md docs/PER_CALL.md --doc=Y.md"
    ), command


def test_the_provenance_table_shows_a_local_file_by_its_name():
    rows = provenance_table(
        {"compiled_call_memo": "on: /tmp/cache/attnkit/torch-2.11/memo_a4cc.so", "gpu": "H100"}
    )
    assert rows[2:] == ["| compiled_call_memo | on: memo_a4cc.so |", "| gpu | H100 |"], rows
    assert public_path("see https://example.org/a/b and docs/X.md") == (
        "see https://example.org/a/b and docs/X.md"
    )


def test_a_page_rendered_again_names_its_tool_as_it_runs_now_with_the_recorded_arguments(
    monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    recorded = "python -m attnkit_tools.decode_table --out /tmp/w/decode.json --md 'my docs/DECODE.md'"
    assert restated(recorded, "pages.decode_table") == (
        "python -m attnkit_tools.pages.decode_table --out decode.json --md 'my docs/DECODE.md'"
    )


@pytest.mark.parametrize("recorded", ["", "python", "decode_table --out x.json", "python3 -c 'print()'"])
def test_a_saved_command_that_is_not_a_module_run_is_refused(recorded):
    with pytest.raises(ValueError, match="python -m MODULE ARGS"):
        restated(recorded, "pages.decode_table")
