"""Small helpers the daemon benchmarks share: a free loopback port and a scrape of /metrics."""
from __future__ import annotations

import socket
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_metrics(url: str, names: tuple[str, ...]) -> dict[str, float]:
    out = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("#"):
                    continue
                parts = line.rsplit(" ", 1)
                if len(parts) == 2 and parts[0] in names:
                    out[parts[0]] = float(parts[1])
    except OSError:
        pass
    return out
