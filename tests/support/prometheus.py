"""Prometheus's HTTP API, as the monitoring tests query it."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request


def api(url: str, path: str, **params: str) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=20) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def instant(url: str, query: str) -> list[dict]:
    return api(url, "/api/v1/query", query=query)["result"]


def scalar(url: str, query: str) -> float:
    result = instant(url, query)
    assert len(result) == 1, f"{query}: {result}"
    return float(result[0]["value"][1])


def firing(url: str, name: str) -> list[dict]:
    alerts = api(url, "/api/v1/alerts")["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]
