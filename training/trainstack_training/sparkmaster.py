"""The Spark standalone master's view of the cluster: which applications hold the cores and
which wait for them.

Read from the ALIVE master's JSON status page (`http://<master>:<web UI port>/json/`, the page
the master's web UI and the stack's Prometheus read), over the cluster's own network: no new
port, nothing written. A standby master's page says STANDBY and lists nothing, so each master
of the multi-master URL is asked until the ALIVE one answers.

Two users: the warm runner (trainstack_training.warm), which yields its cores while idle to an
application that waits for them, and a job whose Spark application waits for cores held by
another application (trainstack_training.launcher.wait_for_slots), which says which one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

# The masters' web UI port on the cluster network (roles/spark_master/defaults/main.yml:
# spark_master_webui_port); TrainConfig.master_ui_port carries it to the job.
DEFAULT_UI_PORT = 8080
TIMEOUT_SECONDS = 2.0
# A job that waits for cores held by another application records why in its run directory
# (JSON {"reason": ...}); the job runner (trainstack_training.queue) shows it in the job's
# record while it exists.


@dataclass(frozen=True)
class Application:
    """One active application on the master (`activeapps` of its JSON page)."""

    id: str
    name: str
    cores: int  # granted now (Spark's JSON has no field for the cores asked for)
    state: str  # WAITING (no executor yet), RUNNING, ...
    memory_mb: int  # per executor

    def __str__(self) -> str:
        return f"application {self.id} ({self.name})"


@dataclass(frozen=True)
class MasterView:
    """The ALIVE master's page: its active applications and its ALIVE workers."""

    url: str
    apps: tuple[Application, ...]
    free_cores: int  # on ALIVE workers
    worker_memory_mb: tuple[int, ...]  # each ALIVE worker's total memory for executors
    total_cores: int = 0  # of the ALIVE workers, used or free

    def others(self, own_app_id: str) -> list[Application]:
        return [a for a in self.apps if a.id != own_app_id]

    def holders(self, own_app_id: str) -> list[Application]:
        """Other applications that hold cores now, the largest first."""
        held = [a for a in self.others(own_app_id) if a.cores > 0]
        return sorted(held, key=lambda a: (-a.cores, a.id))

    def fits(self, app: Application) -> bool:
        """Whether one of the ALIVE workers could ever run one executor of `app`."""
        return any(app.memory_mb <= memory for memory in self.worker_memory_mb)


def master_hosts(master_url: str) -> list[str]:
    """The hosts of a standalone master URL: spark://m1:7077,m2:7077 -> [m1, m2]; [] for
    local[N] and other schedulers."""
    if not master_url.startswith("spark://"):
        return []
    hosts = []
    for part in master_url[len("spark://") :].split(","):
        host = part.strip().rsplit(":", 1)[0] if ":" in part else part.strip()
        if host:
            hosts.append(host)
    return hosts


def parse(url: str, page: dict[str, Any]) -> MasterView:
    """A MasterView from a master's JSON page (its status is checked by the caller)."""
    apps = tuple(
        Application(
            id=str(a.get("id", "")),
            name=str(a.get("name", "")),
            cores=int(a.get("cores", 0) or 0),
            state=str(a.get("state", "")),
            memory_mb=int(a.get("memoryperexecutor", a.get("memoryperslave", 0)) or 0),
        )
        for a in page.get("activeapps", [])
    )
    alive = [w for w in page.get("workers", []) if w.get("state") == "ALIVE"]
    return MasterView(
        url=url,
        apps=apps,
        free_cores=sum(int(w.get("coresfree", 0) or 0) for w in alive),
        worker_memory_mb=tuple(int(w.get("memory", 0) or 0) for w in alive),
        total_cores=sum(int(w.get("cores", 0) or 0) for w in alive),
    )


def alive_master(
    master_url: str, ui_port: int = DEFAULT_UI_PORT, timeout: float = TIMEOUT_SECONDS
) -> MasterView | None:
    """The ALIVE master's view, or None when no master of the URL answers as ALIVE (during a
    takeover, or for a master URL that is not a standalone cluster's)."""
    for host in master_hosts(master_url):
        url = f"http://{host}:{ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                page = json.loads(resp.read().decode())
        except (OSError, ValueError, urllib.error.URLError):
            continue
        if isinstance(page, dict) and page.get("status") == "ALIVE":
            return parse(url, page)
    return None


def waiting_for_cores(view: MasterView, own_app_id: str) -> Application | None:
    """The application an idle holder of cores (`own_app_id`) should give them to, or None.

    One that is WAITING (no executor yet) and could run on one of the workers; else, when no
    ALIVE worker has a free core, one that runs on fewer cores than it could use: Spark's JSON
    does not say how many an application asked for, and a standalone application asks for all
    of them unless it sets spark.cores.max, so any other active application counts then."""
    others = view.others(own_app_id)
    own = next((a for a in view.apps if a.id == own_app_id), None)
    if own is None or own.cores == 0:
        return None  # nothing to give
    for app in others:
        if app.state == "WAITING" and view.fits(app):
            return app
    if view.free_cores == 0:
        for app in others:
            if app.state == "RUNNING" and view.fits(app):
                return app
    return None
