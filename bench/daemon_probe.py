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


def thread_cpu() -> dict[tuple[int, str], float]:
    """CPU seconds of every live Python thread of this process, by (ident, name)."""
    import threading
    import time

    out: dict[tuple[int, str], float] = {}
    for t in threading.enumerate():
        try:
            out[(t.ident, t.name)] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, AttributeError):  # finished meanwhile, or not Linux
            continue
    return out


def thread_cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds each thread used between two ``thread_cpu()`` readings, by name (threads of
    one name summed; threads that started in between count from zero)."""
    out: dict[str, float] = {}
    for (ident, name), v in after.items():
        d = v - before.get((ident, name), 0.0)
        if d > 0.0005:
            out[name] = out.get(name, 0.0) + d
    return out


class StageClock:
    """A daemon hook (``Hooks.add``) that books, per thread, the wall and CPU time between
    consecutive named points (``"learn->learned"``); wall minus CPU is time the thread was not
    running: waiting for the GIL, for the other core, or blocked on I/O or a lock."""

    def __init__(self) -> None:
        import threading

        self._last = threading.local()
        self.wall: dict[tuple[str, str], float] = {}
        self.cpu: dict[tuple[str, str], float] = {}
        self.count: dict[tuple[str, str], int] = {}
        self.active = False

    def __call__(self, point: str) -> None:
        import threading
        import time

        now, cpu = time.perf_counter(), time.thread_time()
        prev = getattr(self._last, "v", None)
        self._last.v = (point, now, cpu)
        if prev is None or not self.active:
            return
        key = (threading.current_thread().name, f"{prev[0]}->{point}")
        self.wall[key] = self.wall.get(key, 0.0) + now - prev[1]
        self.cpu[key] = self.cpu.get(key, 0.0) + cpu - prev[2]
        self.count[key] = self.count.get(key, 0) + 1

    def table(self, min_wall: float = 0.05) -> list[str]:
        rows = sorted(self.wall, key=lambda k: (k[0], -self.wall[k]))
        return [f"    {t:28s} {seg:34s} n={self.count[(t, seg)]:5d} wall {self.wall[(t, seg)]:6.2f} s  "
                f"cpu {self.cpu[(t, seg)]:6.2f} s" for t, seg in rows if self.wall[(t, seg)] >= min_wall]
