"""The process exporter's CPU per scrape: Debian's defaults against trainstack's flags
(`-threads=false -gather-smaps=false`, roles/process_exporter), side by side in one run.

    python bench/bench_process_exporter.py --out bench/results/bench_process_exporter.json \
        [--scrapes 300]

One container of this tree's node image (bake it first: `make images`) runs what a node runs
that matters here: a JVM (a local Spark session, about 60 threads) and Python. Two exporters
with the role's own configuration watch it, one with Debian's defaults (per-thread metrics and
every process's smaps read at each scrape), one with the role's flags. They are scraped in
turn, `--scrapes` times each, from inside the container; each exporter's CPU time comes from
its /proc/<pid>/stat before and after. The container is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit
from infra.images.bake import current_digest, image_tag

ROLE = Path(__file__).resolve().parents[1] / "roles" / "process_exporter"
VARIANTS = {
    "debian_defaults": [],
    "trainstack": ["-threads=false", "-gather-smaps=false"],
}
PORTS = {"debian_defaults": 9301, "trainstack": 9302}
JVM = (
    "from pyspark.sql import SparkSession; "
    "SparkSession.builder.master('local[1]').getOrCreate(); "
    "import time; time.sleep(3600)"
)
SCRAPER = """
import json, os, sys, urllib.request
ports, n = json.loads(sys.argv[1]), int(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick
pids = {name: int(open(f"/tmp/{name}.pid").read()) for name in ports}
before = {name: cpu(pid) for name, pid in pids.items()}
size = {}
for _ in range(n):
    for name, port in ports.items():
        size[name] = len(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())
after = {name: cpu(pid) for name, pid in pids.items()}
print(json.dumps({name: {"cpu_s": round(after[name] - before[name], 2),
                         "bytes": size[name]} for name in ports}))
"""


def role_config() -> str:
    """The role's configuration file as provisioning writes it (the template has no variable
    but the managed-by line)."""
    text = (ROLE / "templates" / "process-exporter.yml.j2").read_text()
    return (
        text.replace("{{ ansible_managed }}", "bench")
        .replace("{% raw %}", "")
        .replace("{% endraw %}", "")
    )


def run(container: Any, command: str) -> str:
    code, out = container.exec_run(["sh", "-c", command])
    text = out.decode(errors="replace")
    if code != 0:
        sys.exit(f"bench: `{command[:80]}` failed ({code}): {text[-2000:]}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    client = docker.from_env()
    image = image_tag(digest=current_digest())
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        sys.exit(f"bench: no node image {image} for this tree: bake it first (`make images`)")
    container = client.containers.run(
        image, entrypoint=["sleep", "3600"], detach=True, labels={"trainstack.bench": "exporter"}
    )
    try:
        container.exec_run(["/opt/trainstack/venv/bin/python", "-c", JVM], detach=True)
        deadline = time.monotonic() + 180
        threads = 0
        while threads < 20:  # the JVM up, its threads started
            if time.monotonic() > deadline:
                sys.exit("bench: the local Spark JVM did not start within 180 s")
            time.sleep(2)
            out = run(container, "ps -C java -o nlwp= || true").split()
            threads = int(out[0]) if out else 0
        config = role_config().replace("'", "'\\''")
        run(container, f"printf '%s' '{config}' > /tmp/pe.yml")
        for name, flags in VARIANTS.items():
            run(
                container,
                f"nohup prometheus-process-exporter -web.listen-address :{PORTS[name]} "
                f"-config.path /tmp/pe.yml {' '.join(flags)} >/tmp/{name}.log 2>&1 & "
                f"echo $! > /tmp/{name}.pid",
            )
        time.sleep(3)
        run(container, f"cat > /tmp/scrape.py <<'EOF'\n{SCRAPER}\nEOF")
        measured = json.loads(
            run(container, f"python3 /tmp/scrape.py '{json.dumps(PORTS)}' {args.scrapes}")
        )
    finally:
        container.remove(force=True)
    result: dict[str, Any] = {
        "image": image,
        "scrapes_each": args.scrapes,
        "jvm_threads": threads,
        "variants": {
            name: {
                "flags": VARIANTS[name],
                "cpu_ms_per_scrape": round(m["cpu_s"] * 1000 / args.scrapes, 1),
                "bytes_per_scrape": m["bytes"],
            }
            for name, m in measured.items()
        },
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
