"""Monitoring on the host side: the utilisation picture of a training run.

After a run, Prometheus's `query_range` gives each node's CPU (cores used, from the process
exporter: the node's own processes, which in a container is the node) and resident memory
over the run's window. The PNG (`utilisation.png`, next to `curves.png`) shows both per node;
the bottleneck is the node whose CPU use was the largest share of its CPU limit.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from trainstack_training.rundir import UTILISATION_PLOT

from infra.config.values import parse_duration

PLOT_FILE = UTILISATION_PLOT  # in the run directory too (trainstack_training.rundir)
CPU_QUERY = "sum by (node) (rate(namedprocess_namegroup_cpu_seconds_total[{window}]))"
MEMORY_QUERY = 'sum by (node) (namedprocess_namegroup_memory_bytes{memtype="resident"})'


class MonitoringError(RuntimeError):
    """Prometheus did not answer or had no samples; the message says which."""


def query_range(url: str, query: str, start: float, end: float, step: float) -> dict[str, list]:
    """{node: [(timestamp, value), ...]} of a `query_range` whose series carry `node`."""
    params = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise MonitoringError(f"Prometheus at {url} rejected {query!r}: {exc} {detail}") from exc
    except Exception as exc:
        raise MonitoringError(f"Prometheus at {url} did not answer query_range: {exc}") from exc
    if body.get("status") != "success":
        raise MonitoringError(f"Prometheus query {query!r} failed: {body.get('error')}")
    series: dict[str, list] = {}
    for item in body["data"]["result"]:
        node = item["metric"].get("node", "?")
        series[node] = [(float(t), float(v)) for t, v in item["values"]]
    return series


def _mean(points: list) -> float:
    values = [v for _, v in points if not math.isnan(v)]
    return sum(values) / len(values) if values else 0.0


def utilisation(
    url: str,
    start: float,
    end: float,
    node_cpus: dict[str, float],
    scrape_interval: str = "15s",
) -> dict[str, Any]:
    """CPU and memory series per node over [start, end], and the bottleneck node."""
    interval = parse_duration(scrape_interval)
    step = max(1.0, interval)
    window = f"{max(4 * int(interval), 4)}s"  # rate() needs at least two samples
    cpu = query_range(url, CPU_QUERY.format(window=window), start, end, step)
    memory = query_range(url, MEMORY_QUERY, start, end, step)
    if not cpu:
        raise MonitoringError(
            f"Prometheus at {url} has no CPU samples of the nodes between {start:.0f} and "
            f"{end:.0f} (is the process exporter up on every node?)"
        )
    nodes = sorted(set(cpu) | set(memory))
    summary = {}
    for node in nodes:
        cores = _mean(cpu.get(node, []))
        limit = node_cpus.get(node) or 1.0
        summary[node] = {
            "cpu_cores_mean": round(cores, 3),
            "cpu_cores_peak": round(max((v for _, v in cpu.get(node, [])), default=0.0), 3),
            "cpu_share_of_limit": round(cores / limit, 3),
            "memory_mib_peak": round(
                max((v for _, v in memory.get(node, [])), default=0.0) / 1024**2, 1
            ),
        }
    bottleneck = max(summary, key=lambda n: summary[n]["cpu_share_of_limit"])
    return {
        "start": start,
        "end": end,
        "cpu": cpu,
        "memory": memory,
        "nodes": summary,
        "bottleneck": bottleneck,
    }


def write_plot(data: dict[str, Any], node_cpus: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = data["start"]
    fig, (ax_cpu, ax_mem) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for node in sorted(data["nodes"]):
        points = data["cpu"].get(node, [])
        limit = node_cpus.get(node) or 1.0
        width = 2.5 if node == data["bottleneck"] else 1.2
        ax_cpu.plot(
            [t - start for t, _ in points],
            [100 * v / limit for _, v in points],
            label=f"{node} (limit {limit:g} CPU)",
            linewidth=width,
        )
        mem = data["memory"].get(node, [])
        ax_mem.plot([t - start for t, _ in mem], [v / 1024**2 for _, v in mem], linewidth=width)
    ax_cpu.set(ylabel="CPU, % of the node's limit", title="CPU per node")
    ax_mem.set(ylabel="resident memory, MiB", xlabel="seconds since the run started")
    ax_mem.set_title("memory per node")
    ax_cpu.legend(fontsize="small", loc="upper right")
    for ax in (ax_cpu, ax_mem):
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"trainstack utilisation: bottleneck {data['bottleneck']} "
        f"({100 * data['nodes'][data['bottleneck']]['cpu_share_of_limit']:.0f} % of its CPU)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_utilisation(
    url: str,
    start: float,
    end: float,
    node_cpus: dict[str, float],
    scrape_interval: str,
    dest_dir: Path,
) -> dict[str, Any]:
    """Wait for the run's last samples, write the PNG into `dest_dir`; the summary for the
    training output."""
    # Scrapes are periodic: one interval (and a second for the scrape itself) after the run
    # ends, every target has been scraped at least once past its end.
    time.sleep(min(parse_duration(scrape_interval) + 1, 30))
    data = utilisation(url, start, end, node_cpus, scrape_interval)
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / PLOT_FILE
    write_plot(data, node_cpus, path)
    return {"plot": str(path), "bottleneck": data["bottleneck"], "nodes": data["nodes"]}
