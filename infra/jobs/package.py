"""Pack a user's training-code directory into one deterministic .tar.gz to ship to a cluster.

`pack(directory)` lists the files to ship (`list_files`), refuses a directory over a size cap
before reading any content, and builds a reproducible archive: the same files with the same
bytes give the same archive and the same sha256, whatever their mtimes, owners or the
directory's absolute path. `unpack_command(archive, dest)` is the argv a Linux node runs to
extract it into a content-addressed directory, atomically.

What is shipped:

- Never: anything named `.git` (a repository's directory, or a worktree's `.git` file) at any
  depth, `__pycache__` and `.trainstack` directories, `*.pyc` files. No ignore file can bring
  these back.
- `.gitignore` files are honoured as git does: each applies to its own directory and below,
  and a deeper one takes precedence over the ones above it. A `.trainstackignore` in the root
  (gitignore syntax) applies to the whole directory and takes precedence over every
  `.gitignore`, so it can exclude more or re-include (`!name`) what git ignores. Matching is
  `pathspec.GitIgnoreSpec`'s; an ignored directory is not descended into, so a large ignored
  `data/` costs nothing (as in git, a file inside an ignored directory cannot be re-included).
- Only regular files are shipped; directories are implied by the paths. A symlink to a file
  inside the directory is shipped as a copy of that file, under the link's name. A symlink
  pointing outside the directory, into a `.git` directory, to a directory, or nowhere
  (dangling or looping) is an error naming it, as is any other special file (FIFO, socket).

The archive: PAX-format tar, entries sorted by path, mtime 0, uid/gid 0, empty owner names,
mode 0o755 when the owner may execute the file else 0o644; gzip with mtime 0 and no file name.
`Packed.sha` is the sha256 of the uncompressed tar. The cap (`DEFAULT_CAP_BYTES`) applies to
the sum of the files' sizes as stat reports them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shlex
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pathspec

from infra.errors import UserFacingError

DEFAULT_CAP_BYTES = 50 * 1024 * 1024
IGNORE_FILE = ".trainstackignore"
GITIGNORE_FILE = ".gitignore"

# Names never shipped, whatever their type, and the suffix of files never shipped.
_ALWAYS_SKIPPED_NAMES = frozenset({".git", "__pycache__", ".trainstack"})
_ALWAYS_SKIPPED_SUFFIX = ".pyc"
_LARGEST_SHOWN = 5
_MB = 1024 * 1024


class JobDirError(UserFacingError):
    """The job directory cannot be packed; the message names the path and what to do."""


@dataclass(frozen=True)
class Packed:
    """A packed job directory: the .tar.gz, the sha256 of its tar and what it holds."""

    sha: str
    """Hex sha256 (64 characters) of the uncompressed tar."""
    data: bytes = field(repr=False)
    """The .tar.gz itself."""
    files: list[str]
    """The files in the archive: relative posix paths, sorted."""
    size: int
    """The sum of the files' sizes, uncompressed."""

    @property
    def short(self) -> str:
        """The first 12 characters of `sha`, for names and messages."""
        return self.sha[:12]


@dataclass(frozen=True)
class _Ignore:
    """One ignore file's patterns and the directory they apply to ("" or "sub/dir/")."""

    base: str
    spec: pathspec.GitIgnoreSpec


def _read_ignore(path: str, base: str) -> _Ignore | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise JobDirError(
            f"cannot read the ignore file {path} ({exc.strerror}); make it readable or remove it"
        ) from exc
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    return _Ignore(base, spec) if spec.patterns else None


def _is_ignored(rel: str, is_dir: bool, ignores: list[_Ignore]) -> bool:
    """Whether the last ignore file (in precedence order) with a pattern matching `rel` ignores
    it."""
    candidate = rel + "/" if is_dir else rel
    ignored = False
    for ignore in ignores:
        if not candidate.startswith(ignore.base):
            continue
        include = ignore.spec.check_file(candidate[len(ignore.base) :]).include
        if include is not None:
            ignored = include
    return ignored


def _checked_root(directory: Path) -> Path:
    shown = directory.absolute()
    if not directory.exists():
        raise JobDirError(
            f"job directory {shown} does not exist; pass the directory that holds the training code"
        )
    if not directory.is_dir():
        raise JobDirError(
            f"job directory {shown} is not a directory; pass the directory that holds the "
            "training code"
        )
    return shown


def _check_link(root_real: str, root: Path, rel: str) -> None:
    """Check that the symlink `rel` points to a regular file inside the root (not in .git)."""
    link = root / rel
    hint = f"replace it with the file itself or list it in {root / IGNORE_FILE}"
    try:
        target = os.path.realpath(link, strict=True)
    except OSError as exc:
        raise JobDirError(
            f"{link} is a symlink to {os.readlink(link)}, which does not exist "
            f"({exc.strerror}); {hint}"
        ) from exc
    if os.path.commonpath([root_real, target]) != root_real:
        raise JobDirError(
            f"{link} is a symlink to {target}, outside the job directory {root}; only links "
            f"to files inside it can be shipped: {hint}"
        )
    if ".git" in PurePosixPath(os.path.relpath(target, root_real)).parts:
        raise JobDirError(
            f"{link} is a symlink into a .git directory ({target}), which is never shipped; {hint}"
        )
    if not stat.S_ISREG(os.stat(target).st_mode):
        raise JobDirError(
            f"{link} is a symlink to {target}, which is not a regular file (links to "
            f"directories are not followed); {hint}"
        )


def _walk(
    root: Path, root_real: str, rel_dir: str, ignores: list[_Ignore], found: list[Path]
) -> None:
    """Add the files to ship under `rel_dir` ("" or "sub/dir/") to `found`."""
    path = root / rel_dir if rel_dir else root
    try:
        with os.scandir(path) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError as exc:
        raise JobDirError(
            f"cannot list {path} ({exc.strerror}); make it readable or list it in "
            f"{root / IGNORE_FILE}"
        ) from exc

    gitignore = next(
        (e for e in entries if e.name == GITIGNORE_FILE and e.is_file(follow_symlinks=False)),
        None,
    )
    if gitignore is not None:
        nested = _read_ignore(gitignore.path, rel_dir)
        if nested is not None:
            # Deeper .gitignore files take precedence over shallower ones; the root's
            # .trainstackignore (always last) over all of them.
            ignores = [*ignores[:-1], nested, ignores[-1]]

    for entry in entries:
        name = entry.name
        if name in _ALWAYS_SKIPPED_NAMES:
            continue
        rel = rel_dir + name
        is_link = entry.is_symlink()
        is_dir = not is_link and entry.is_dir(follow_symlinks=False)
        if is_dir:
            if not _is_ignored(rel, True, ignores):
                _walk(root, root_real, rel + "/", ignores, found)
            continue
        if name.endswith(_ALWAYS_SKIPPED_SUFFIX) or _is_ignored(rel, False, ignores):
            continue
        if is_link:
            _check_link(root_real, root, rel)
        elif not entry.is_file(follow_symlinks=False):
            raise JobDirError(
                f"{entry.path} is not a regular file (a FIFO, socket or device); remove it or "
                f"list it in {root / IGNORE_FILE}"
            )
        found.append(Path(rel))


def list_files(directory: Path) -> list[Path]:
    """The files to ship from `directory`, relative to it, sorted (see the module's rules)."""
    root = _checked_root(directory)
    root_real = os.path.realpath(root)
    top = _read_ignore(str(root / IGNORE_FILE), "") if (root / IGNORE_FILE).is_file() else None
    # The last entry is always the .trainstackignore (an empty spec when there is none).
    ignores = [top or _Ignore("", pathspec.GitIgnoreSpec.from_lines([]))]
    found: list[Path] = []
    _walk(root, root_real, "", ignores, found)
    return sorted(found)


def _mb(size: int) -> str:
    return f"{size / _MB:.1f} MB"


def _tar_entry(name: str, content: bytes, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.REGTYPE
    info.size = len(content)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if executable else 0o644
    return info


def pack(directory: Path, cap_bytes: int = DEFAULT_CAP_BYTES) -> Packed:
    """Pack `directory`'s files (see `list_files`) into a deterministic .tar.gz.

    Raises `JobDirError` when the directory is missing, has nothing to ship, or its files
    add up to more than `cap_bytes` (checked from their sizes before any is read).
    """
    root = _checked_root(directory)
    names = sorted(path.as_posix() for path in list_files(directory))
    if not names:
        raise JobDirError(
            f"job directory {root} has no files to ship once .gitignore, {IGNORE_FILE} and the "
            "fixed rules (.git, __pycache__, *.pyc, .trainstack) are applied; check those "
            "ignore files"
        )

    try:
        stats = {name: os.stat(root / name) for name in names}
    except OSError as exc:
        raise JobDirError(
            f"cannot stat {exc.filename} ({exc.strerror}) in job directory {root}; did it "
            "change while being packed?"
        ) from exc
    total = sum(st.st_size for st in stats.values())
    if total > cap_bytes:
        largest = sorted(names, key=lambda name: (-stats[name].st_size, name))[:_LARGEST_SHOWN]
        shown = ", ".join(f"{name} ({_mb(stats[name].st_size)})" for name in largest)
        raise JobDirError(
            f"job directory {root} holds {_mb(total)} to ship, over the {_mb(cap_bytes)} cap; "
            f"the largest files are {shown}: list what the job does not need in "
            f"{root / IGNORE_FILE} (gitignore syntax)"
        )

    raw = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for name in names:
            try:
                content = (root / name).read_bytes()
            except OSError as exc:
                raise JobDirError(
                    f"cannot read {root / name} ({exc.strerror}); make it readable or list it "
                    f"in {root / IGNORE_FILE}"
                ) from exc
            executable = bool(stats[name].st_mode & stat.S_IXUSR)
            tar.addfile(_tar_entry(name, content, executable), io.BytesIO(content))
            size += len(content)
    tar_bytes = raw.getvalue()

    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=compressed, mode="wb", mtime=0) as gz:
        gz.write(tar_bytes)
    return Packed(
        sha=hashlib.sha256(tar_bytes).hexdigest(),
        data=compressed.getvalue(),
        files=names,
        size=size,
    )


def unpack_command(archive: str, dest: str) -> list[str]:
    """The argv that extracts the .tar.gz `archive` into `dest` on a Linux node, atomically.

    `dest` is content-addressed (named after the archive's sha), so when it exists it already
    holds the same files and the command leaves it alone. Otherwise it extracts into
    `dest.partial.<pid>` and renames that to `dest` (with `mv -T`: should a concurrent run
    have created `dest` meanwhile, the rename fails, the partial copy is removed and that
    `dest` is kept; a failed extraction leaves no partial copy). Files get the extraction time
    as mtime (`tar -m`: mtime 0 would make zip tools refuse them). The archive is removed in
    both cases.
    """
    script = f"""set -eu
archive={shlex.quote(archive)}
dest={shlex.quote(dest)}
if [ ! -e "$dest" ]; then
  partial="$dest.partial.$$"
  trap 'rm -rf "$partial"' EXIT
  rm -rf "$partial"
  mkdir -p "$partial"
  tar -xmzf "$archive" -C "$partial"
  if ! mv -T "$partial" "$dest"; then
    rm -rf "$partial"
    [ -d "$dest" ]
  fi
fi
rm -f "$archive"
"""
    return ["sh", "-c", script]
