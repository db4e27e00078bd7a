"""The stack's outputs, kept beside its local state so that `trainstack` asks Pulumi once.

`pulumi stack output` is a Pulumi start and a read of the whole state (0.15 s of CPU for a
400 kB state on the 2-core machine), and `trainstack` needs the outputs on every call (a
polling `status` loop pays it each time). With a local backend
(`file://`, as `eval "$(make -s env)"` sets it: `.pulumi-state/`) the outputs change only
when the stack's state file does, and every `pulumi up`, `destroy`, `refresh`, `import` or
`stack rm` rewrites or removes that file
(`<backend>/.pulumi/stacks/<project>/<stack>.json`). So the outputs are kept in
`<backend>/.trainstack-outputs/<project>/<stack>.json` with the state file's identity
(inode, size, modification time in ns), the backend URL and the stack's name, and reused
while all of these are unchanged.

The cache holds what `pulumi stack output --json` printed (no `--show-secrets`: a secret is
`"[secret]"` there), still as a private file: mode 0600 in 0700 folders, written whole
(a temporary file, then `os.replace`), read only when it is this user's and private. Any
other backend, a stack this module cannot name (no `--stack`, `$PULUMI_STACK` or selection
it reads), a stack with no state file here, or a cache file that does not read back whole:
Pulumi is asked, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from infra.config.values import PROJECT_DIR

CACHE_DIR = ".trainstack-outputs"
# A stack's name as the file backend keeps it (and a project's, in Pulumi.yaml).
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_PROJECT_LINE = re.compile(r"^name:\s*['\"]?([A-Za-z0-9_.-]+)['\"]?\s*$", re.MULTILINE)
_VERSION = 1


def backend_dir(url: str, project_dir: Path = PROJECT_DIR) -> Path | None:
    """The folder of a `file://` backend URL (`file://~` is the home folder; a relative path
    is the project's, where Pulumi runs), or None for any other backend."""
    if not url.startswith("file://"):
        return None
    path = url.removeprefix("file://").split("?", 1)[0]
    if not path:
        return None
    if path == "~" or path.startswith("~/"):
        return Path(os.path.expanduser(path))
    return Path(path) if os.path.isabs(path) else project_dir / path


def project_name(project_dir: Path = PROJECT_DIR) -> str | None:
    """The project's name (`name:` in Pulumi.yaml), or None when it cannot be read."""
    try:
        match = _PROJECT_LINE.search((project_dir / "Pulumi.yaml").read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def selected_stack(env: Mapping[str, str], project: str, project_dir: Path = PROJECT_DIR) -> str:
    """The stack `pulumi stack select` chose for this project and backend, or "" when there
    is none or it cannot be read. Pulumi keeps it in `$PULUMI_HOME/workspaces/<project>-<SHA-1
    of Pulumi.yaml's real path>-workspace.json`: `stacks` maps the backend URL, exactly as
    given, to the stack; `stack` is the older form, for any backend."""
    home = env.get("PULUMI_HOME") or os.path.join(os.path.expanduser("~"), ".pulumi")
    yaml_path = os.path.join(os.path.realpath(project_dir), "Pulumi.yaml")
    digest = hashlib.sha1(yaml_path.encode(), usedforsecurity=False).hexdigest()
    path = Path(home) / "workspaces" / f"{project}-{digest}-workspace.json"
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(settings, dict):
        return ""
    stacks = settings.get("stacks")
    url = env.get("PULUMI_BACKEND_URL", "")
    if isinstance(stacks, dict) and url in stacks:
        return str(stacks[url] or "")
    return str(settings.get("stack") or "")


def stack_name(stack: str, project: str) -> str | None:
    """The stack's short name from `dev` or `organization/<project>/dev`, or None for any
    other form (another project's stack, or a name this module does not parse)."""
    parts = stack.split("/")
    if len(parts) == 3 and parts[0] == "organization" and parts[1] == project:
        parts = parts[2:]
    return parts[0] if len(parts) == 1 and _NAME.match(parts[0]) else None


def state_key(
    stack: str | None, env: Mapping[str, str], project_dir: Path = PROJECT_DIR
) -> tuple[Path, dict[str, Any]] | None:
    """The cache file of the stack's outputs and the key its content must carry: the backend
    URL, project, stack and the identity of every file the state can be in (the project's
    folder and the legacy one, plain or gzipped). None when the outputs cannot be cached:
    another backend, no stack named or selected (or one named in a form not parsed here),
    or no state file at all."""
    url = env.get("PULUMI_BACKEND_URL", "")
    backend = backend_dir(url, project_dir)
    project = project_name(project_dir)
    if backend is None or project is None or not _NAME.match(project):
        return None
    # As Pulumi picks it: --stack, else $PULUMI_STACK, else the selected stack.
    picked = stack or env.get("PULUMI_STACK") or selected_stack(env, project, project_dir)
    name = stack_name(picked, project)
    if not name:
        return None
    stacks = backend / ".pulumi" / "stacks"
    files: list[list[Any]] = []
    for folder in (stacks / project, stacks):
        for suffix in (".json", ".json.gz"):
            path = folder / f"{name}{suffix}"
            try:
                st = path.stat()
            except OSError:
                files.append([str(path), None])
                continue
            files.append([str(path), st.st_ino, st.st_size, st.st_mtime_ns])
    if all(entry[1] is None for entry in files):
        return None
    key = {"version": _VERSION, "backend": url, "project": project, "stack": name, "state": files}
    return backend / CACHE_DIR / project / f"{name}.json", key


def read_cache(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The outputs kept in `path` for `key`, or None: no such file, another key, a file that
    is not this user's or not private, or one that does not parse."""
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
                return None
            kept = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    outputs = kept.get("outputs")
    return dict(outputs) if isinstance(outputs, dict) else None


def write_cache(path: Path, key: dict[str, Any], outputs: Mapping[str, Any]) -> None:
    """Keep `outputs` for `key` in `path` (0600, its folders 0700), replacing it whole; a
    folder that cannot be written only means no cache."""
    tmp = ""
    try:
        for folder in (path.parent.parent, path.parent):
            folder.mkdir(mode=0o700, exist_ok=True)
            if stat.S_IMODE(folder.stat().st_mode) != 0o700:
                folder.chmod(0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "outputs": dict(outputs)}, f)
        os.replace(tmp, path)
        tmp = ""
    except OSError:
        pass
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def cached_outputs(
    stack: str | None,
    env: Mapping[str, str],
    fetch: Callable[[], dict[str, Any]],
    project_dir: Path = PROJECT_DIR,
) -> dict[str, Any]:
    """The stack's outputs: the kept ones while its state file is unchanged, else `fetch()`'s
    (`pulumi stack output`), kept for the next call. The state's identity is taken before
    `fetch` runs, so outputs read during a `pulumi up` are never kept under the state the
    `up` then writes."""
    found = state_key(stack, env, project_dir)
    if found is None:
        return fetch()
    path, key = found
    kept = read_cache(path, key)
    if kept is not None:
        return kept
    outputs = fetch()
    write_cache(path, key, outputs)
    return outputs
