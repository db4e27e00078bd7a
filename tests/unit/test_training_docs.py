"""docs/training.md's configuration table against TrainConfig and the trainstack-train CLI:
every option documented, none documented that does not exist, the defaults equal."""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from trainstack_training.config import TrainConfig, build_parser

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"
# How the table shows an empty string (or, for --config, no default at all): an en dash.
NO_DEFAULT = "\u2013"


def _table() -> dict[str, tuple[list[str], str]]:
    """The rows of "## Configuration reference": first flag -> (every flag named, default)."""
    text = DOC.read_text(encoding="utf-8")
    section = re.search(r"^## Configuration reference\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "docs/training.md has no '## Configuration reference' section"
    rows: dict[str, tuple[list[str], str]] = {}
    for line in section.group(1).splitlines():
        if not line.startswith("| `--"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ", 2)]
        assert len(cells) == 3, f"not a flag | default | meaning row: {line}"
        flags = re.findall(r"`(--[a-z0-9-]+)", cells[0])
        assert flags[0] not in rows, f"{flags[0]} is documented twice"
        rows[flags[0]] = (flags, cells[1])
    assert rows, "no option rows found in docs/training.md's configuration table"
    return rows


def _options() -> dict[str, argparse.Action]:
    """The CLI's options (but --help): first long flag -> its argparse action."""
    return {
        action.option_strings[0]: action
        for action in build_parser()._actions
        if action.option_strings and action.dest != "help"
    }


def _shown(default: object) -> set[str]:
    """The ways the table may show a field's default."""
    if isinstance(default, bool):
        return {"on" if default else "off"}
    if isinstance(default, str):
        return {f"`{default}`" if default else NO_DEFAULT}
    return {str(default)}


def test_every_option_is_documented_and_every_documented_option_exists():
    documented, options = set(_table()), set(_options())
    missing = sorted(options - documented)
    assert not missing, f"missing from docs/training.md: {missing}"
    assert not documented - options, (
        f"documented in docs/training.md, not options of trainstack-train: "
        f"{sorted(documented - options)}"
    )


def test_boolean_options_show_both_forms():
    table = _table()
    for flag, action in _options().items():
        if isinstance(action, argparse.BooleanOptionalAction) and flag in table:
            assert table[flag][0] == action.option_strings, (
                f"docs/training.md should show {' / '.join(action.option_strings)}, "
                f"shows {' / '.join(table[flag][0])}"
            )


def test_documented_defaults_are_the_config_defaults():
    table = _table()
    by_dest = {f.name: f for f in fields(TrainConfig)}
    wrong = {}
    for flag, action in _options().items():
        if flag not in table:  # the test above names it
            continue
        field = by_dest.get(action.dest)
        shown = table[flag][1]
        if field is None:  # --config: not a field, no default
            expected = {NO_DEFAULT}
        else:
            assert field.default is not MISSING, f"{field.name} has no default"
            expected = _shown(field.default)
            if isinstance(field.default, (int, float)) and not isinstance(field.default, bool):
                try:
                    if float(shown) == field.default:
                        continue
                except ValueError:
                    pass
        if shown not in expected:
            wrong[flag] = (shown, sorted(expected))
    assert not wrong, f"defaults in docs/training.md (shown, expected): {wrong}"
