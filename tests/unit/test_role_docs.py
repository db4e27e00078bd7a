"""Each role's README.md against its defaults/main.yml, and the paths ARCHITECTURE.md names.

A role's README has a "Role Variables" table (`| variable | default | meaning |`) listing every
variable of its defaults, none that the role lacks, with the literal defaults as they are in
the file. Backticked paths in ARCHITECTURE.md and the role READMEs must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())


def _defaults(role: str) -> dict:
    path = REPO / "roles" / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _readme(role: str) -> str:
    path = REPO / "roles" / role / "README.md"
    assert path.exists(), f"role {role} has no README.md (roles/{role}/README.md)"
    return path.read_text(encoding="utf-8")


def _table(role: str) -> dict[str, str]:
    """The README's "## Role Variables" rows: variable -> default cell."""
    match = re.search(r"^## Role Variables\n(.*?)(?=^## |\Z)", _readme(role), re.M | re.S)
    assert match, f"roles/{role}/README.md has no '## Role Variables' section"
    return dict(re.findall(r"^\| `([a-z0-9_]+)` \| (.*?) \| .* \|$", match.group(1), re.M))


def _shown(value: object) -> str | None:
    """How a README shows a literal scalar default; None for lists, maps and templates."""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, int | float):
        return f"`{value}`"
    if isinstance(value, str) and "{{" not in value:
        return f"`{value}`" if value else "empty"
    return None


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_names_every_default(role):
    text = _readme(role)
    missing = sorted(name for name in _defaults(role) if f"`{name}`" not in text)
    assert not missing, f"role {role}: roles/{role}/README.md does not name {missing}"


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_table_matches_defaults(role):
    defaults, table = _defaults(role), _table(role)
    missing = sorted(set(defaults) - set(table))
    assert not missing, f"role {role}: not in its README's Role Variables table: {missing}"
    extra = sorted(set(table) - set(defaults))
    assert not extra, f"role {role}: its README lists variables the role does not have: {extra}"
    wrong = {
        name: (table[name], _shown(value))
        for name, value in defaults.items()
        if _shown(value) is not None and table[name] != _shown(value)
    }
    assert not wrong, f"role {role}: defaults in its README (shown, actual): {wrong}"


def _missing_paths(doc: Path, *bases: Path) -> list[str]:
    """Backticked tokens of `doc` that look like repository paths (a '/', no space, no '<',
    not absolute, not a URL, not a dot-folder made at run time such as `.artifacts/`) and exist
    under none of `bases`; '*' is a glob."""
    missing = []
    for token in sorted(set(re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8")))):
        if "/" not in token or any(c in token for c in " <{") or token.startswith(("/", "~", ".")):
            continue
        if "://" in token:
            continue
        path = token.rstrip("/")
        if not any((list(b.glob(path)) if "*" in path else (b / path).exists()) for b in bases):
            missing.append(token)
    return missing


def test_architecture_paths_exist():
    doc = REPO / "ARCHITECTURE.md"
    assert doc.exists(), "ARCHITECTURE.md is missing"
    missing = _missing_paths(doc, REPO)
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_paths_exist(role):
    role_dir = REPO / "roles" / role
    _readme(role)
    missing = _missing_paths(role_dir / "README.md", REPO, role_dir)
    assert not missing, f"roles/{role}/README.md names paths that do not exist: {missing}"


def _role_vars(role: str) -> set[str]:
    """The variables a role defines: its defaults and its vars/main.yml."""
    path = REPO / "roles" / role / "vars" / "main.yml"
    own = set(_defaults(role))
    return own | set((yaml.safe_load(path.read_text()) or {}) if path.exists() else {})


def _declared(role: str) -> set[str]:
    """The roles a role declares: its meta dependencies and the roles its tasks include."""
    meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text()) or {}
    deps = {d if isinstance(d, str) else d["role"] for d in meta.get("dependencies") or []}
    tasks = "\n".join(p.read_text() for p in (REPO / "roles" / role).rglob("*.yml"))
    included = re.findall(r"ansible\.builtin\.(?:include|import)_role:\s*\n\s*name: (\w+)", tasks)
    return deps | set(included)


@pytest.mark.parametrize("role", ROLES)
def test_role_defaults_name_no_project_variable(role):
    """The project's trainstack_* variables reach a role through playbooks/group_vars/all.yml,
    never through its defaults: a role runs alone with its own."""
    for name in ("defaults", "vars"):
        path = REPO / "roles" / role / name / "main.yml"
        if path.exists():
            jinja = " ".join(re.findall(r"{{.*?}}|{%.*?%}", path.read_text(), re.S))
            found = sorted(set(re.findall(r"\btrainstack_[a-z0-9_]+", jinja)))
            assert not found, f"roles/{role}/{name}/main.yml names {found}: map them in group_vars"


@pytest.mark.parametrize("role", ROLES)
def test_role_reads_only_declared_roles_variables(role):
    """A role names another role's variable only when it declares that role: a meta dependency,
    or the include_role / import_role that runs it. Otherwise the role gets a variable of its own
    and playbooks/group_vars/all.yml maps it."""
    declared = _declared(role) | {role}
    owner = {name: other for other in ROLES if other not in declared for name in _role_vars(other)}
    text = "\n".join(
        p.read_text() for p in (REPO / "roles" / role).rglob("*") if p.suffix in (".yml", ".j2")
    )
    words = set(re.findall(r"\b[a-z_][a-z0-9_]*\b", text))
    found = sorted(f"{w} ({owner[w]})" for w in words if w in owner)
    assert not found, f"role {role} names variables of roles it does not declare: {found}"
