"""The settings table (docs/settings.md) is the one the settings models render, and it names every
``TW_*`` variable the code reads and every one the documentation mentions."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field

from shared import settings_doc
from shared.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"\bTW_[A-Z0-9_]*[A-Z0-9]\b")
# How the scripts and tools read a variable: ${TW_X:-default}, .get("TW_X"...), environ["TW_X"]
READS = re.compile(r"""(?:\$\{|\.get\(\s*["']|environ\[["'])(TW_[A-Z0-9_]+)""")


def _table_variables() -> set[str]:
    return {row.variable for row in settings_doc.all_rows()}


def test_the_document_block_is_the_rendered_table() -> None:
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert settings_doc.block(doc) == "\n" + settings_doc.render(), (
        "docs/settings.md is stale: run .venv/bin/python -m shared.settings_doc --write"
    )


def test_every_field_of_every_settings_model_has_a_row() -> None:
    rows = settings_doc.model_rows()
    for _, cls in settings_doc.load_models():
        for name in cls.model_fields:
            assert any(r.variable == cls.env_key(name) for r in rows), name


def test_every_variable_the_code_reads_has_a_row() -> None:
    sources = [*ROOT.glob("infra/*.sh"), ROOT / "docker-compose.yml"]
    for folder in ("services", "shared", "tests"):
        sources += (p for p in (ROOT / folder).rglob("*.py") if p != Path(__file__).resolve())
    read = {m for path in sources for m in READS.findall(path.read_text())}
    assert "TW_STACK" in read and "TW_TEST_DEVICE" in read  # the patterns do find reads
    missing = read - _table_variables() - {"TW_FOO_BAR"}  # a docstring's example
    assert not missing, f"add these to SCRIPT_SETTINGS in shared/settings_doc.py: {missing}"


def test_every_variable_the_docs_mention_has_a_row() -> None:
    known = _table_variables()
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        unknown = set(VARIABLE.findall(path.read_text())) - known - {"TW_FOO_BAR"}
        assert not unknown, f"{path.name} mentions settings that do not exist: {unknown}"


class _Example(CommonSettings):
    plain: int = 3
    choice: bool = Field(False, description="a | b")


def test_rows_for_fields_with_and_without_a_description() -> None:
    rows = {r.variable: r for r in settings_doc.model_rows([("svc", _Example)])}
    assert rows["TW_PLAIN"] == settings_doc.Row("TW_PLAIN", "svc", "`3`", "")
    assert rows["TW_CHOICE"].default == "`false`"
    # A setting every service reads as CommonSettings does is read by "all".
    assert rows["TW_REDIS_URL"].where == settings_doc.ALL
    table = settings_doc.render([rows["TW_CHOICE"]])
    assert table.splitlines()[-1] == "| `TW_CHOICE` | svc | `false` | a \\| b |"


def test_write_replaces_only_the_block() -> None:
    text = f"intro\n{settings_doc.BEGIN}\nold\n{settings_doc.END}\nrest\n"
    new = settings_doc.with_table(text, "| t |\n")
    assert new == f"intro\n{settings_doc.BEGIN}\n| t |\n{settings_doc.END}\nrest\n"
    assert settings_doc.with_table(new, "| t |\n") == new
