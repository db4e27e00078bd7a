"""The warm runner's private directory on its node, and the timings of its registration in the
runs directory: read by both of its processes, the job's driver (client.py: it attaches) and
the runner's own (server.py: it serves).

The directory, `STATE_DIR_PREFIX + uid` (0700, this user's), holds the runner's files: these
are not in a run directory (rundir.py), they are the node's and the user's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainstack_training.rundir import read_json

INFO = "runner.json"  # port, secret, settings key, pid: mode 0600
LOG = "runner.log"
CONFIG = "config.json"  # the settings of the job that started the runner
LOCK = "lock"
LEASE_PREFIX = "lease-"  # lease-<pid>: a job attached; holds its job group
# A user's runner state lives in STATE_DIR_PREFIX + uid on each node (the common role's teardown
# removes it: common_warm_runner_dir_prefix).
STATE_DIR_PREFIX = "/tmp/trainstack-warm-"
# The runner's registration in the runs directory (rundir.WARM_RUNNER_FILE): rewritten this
# often by the runner; a job on another node takes one older than the stale limit for gone.
HEARTBEAT_SECONDS = 3.0
HEARTBEAT_STALE_SECONDS = 10.0


class WarmRunnerError(RuntimeError):
    """The warm runner could not be started or reached; the message says why and where its
    log is."""


def state_dir() -> Path:
    """The node-local directory of this user's runner: 0700, owned by this user."""
    path = Path(os.environ.get("TRAINSTACK_WARM_DIR") or f"{STATE_DIR_PREFIX}{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WarmRunnerError(
            f"{path} must be a directory of uid {os.getuid()} with mode 0700 "
            f"(it is uid {st.st_uid}, mode {st.st_mode & 0o777:o}); remove it and run again"
        )
    return path


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that exited) is not alive.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0] == "Z":
            return False
    return True


@contextlib.contextmanager
def locked_file(path: Path, mode: int = 0o600) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created with `mode`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def locked(state: Path) -> contextlib.AbstractContextManager[None]:
    """This node's runner lock: held while a job attaches and while the runner decides to
    stop, so that no job attaches to a runner that is stopping."""
    return locked_file(state / LOCK)


def live_runner(state: Path) -> dict[str, Any]:
    """This node's runner (its runner.json), or {} when none runs."""
    info = read_json(state / INFO)
    return info if info and alive(int(info.get("pid", 0))) else {}
