"""The training package's layout rules (issue 49): no module over 450 lines, and every module
opens with a docstring (what it does and which process runs it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "training" / "trainstack_training"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MAX_LINES = 450


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_stays_small_and_says_what_it_is(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines (at most {MAX_LINES})"
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"
