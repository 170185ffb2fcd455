"""attnkit_tools.provenance: a page's command and provenance name no scratch path of the machine
that produced it."""

from __future__ import annotations

from pathlib import Path

from attnkit_tools.provenance import produced_by, provenance_table, public_path


def test_the_command_names_scratch_files_by_their_name_and_keeps_repository_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    inside = str(Path(tmp_path) / "docs" / "PER_CALL.md")
    command = produced_by(
        "per_call", ["--out", "/tmp/w/per_call.json", "--md", inside, "--doc=/scratch/a/Y.md"]
    )
    assert command == (
        "python -m attnkit_tools.per_call --out per_call.json --md docs/PER_CALL.md --doc=Y.md"
    ), command


def test_the_provenance_table_shows_a_local_file_by_its_name():
    rows = provenance_table(
        {"compiled_call_memo": "on: /tmp/cache/attnkit/torch-2.11/memo_a4cc.so", "gpu": "H100"}
    )
    assert rows[2:] == ["| compiled_call_memo | on: memo_a4cc.so |", "| gpu | H100 |"], rows
    assert public_path("see https://example.org/a/b and docs/X.md") == (
        "see https://example.org/a/b and docs/X.md"
    )
