"""PID 1 of an instance container: Patroni as its child, stopped while the instance is fenced.

Fencing takes one instance out of service and keeps it for inspection: PostgreSQL stopped
cleanly (Patroni's shutdown: a primary hands its lock over first, so a synchronous standby
takes over), the pod, its volume and its logs kept. The operator writes the fenced instances
of a cluster into the ConfigMap ``NAME-fencing`` (from the ``stateward.io/fenced-instances``
annotation); each supervisor watches that ConfigMap with the pod's own identity, which may
read ConfigMaps for Patroni anyway. A pod recreated while fenced therefore stays fenced
from its first second.

Everything else is as when Patroni was PID 1 itself: the runtime's signals go to Patroni,
the container exits with Patroni's status when Patroni dies (so a killed Patroni still takes
PostgreSQL with it and the kubelet restarts the container), and orphans are reaped. While
fenced, the supervisor answers the kubelet's probes on Patroni's port itself (HTTPS with
Patroni's certificate, as the probes expect): alive, never ready, so the Services leave the
instance out.

The serving certificate is a mounted Secret the operator renews; the kubelet replaces its
files in place. The supervisor notices (it compares their digest every
:data:`CERTIFICATE_CHECK_INTERVAL`) and sends Patroni SIGHUP: Patroni reloads its REST API's
certificate and has PostgreSQL reload, which re-reads its own. No restart, no failover.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import select
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from stateward.instance import metrics, pooler, upgrade, wakeup

FENCING_SUFFIX: Final = "-fencing"
FENCING_KEY: Final = "instances"
ALL: Final = "*"
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
STATE_FILE_NAME: Final = "stateward-fenced"
"""In the pod's /tmp emptyDir: the last fencing state seen survives a container restart."""
CERTIFICATE_CHECK_INTERVAL: Final = 10.0
"""The kubelet refreshes a Secret volume about once a minute; this adds little to that."""


class Certificate:
    """A serving certificate and key on disk; :meth:`changed` is true once per change of
    their content (a missing file reads as empty)."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._digest = self._read()

    def _read(self) -> str:
        digest = hashlib.sha256()
        for path in (self.cert, self.key):
            with contextlib.suppress(OSError):
                digest.update(Path(path).read_bytes())
            digest.update(b"\0")
        return digest.hexdigest()

    def changed(self) -> bool:
        current = self._read()
        if current == self._digest:
            return False
        self._digest = current
        return True

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def fenced_in(data: dict[str, str] | None, pod: str) -> bool:
    """Whether ``pod`` is among the fenced instances of a ``NAME-fencing`` ConfigMap's data
    (a JSON list of pod names, or ``["*"]`` for all). Unreadable data fences nothing: the
    operator writes only lists it validated."""
    try:
        names = json.loads((data or {}).get(FENCING_KEY) or "[]")
    except ValueError:
        return False
    return isinstance(names, list) and (pod in names or ALL in names)


def watch_events(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The objects of a Kubernetes watch stream, one JSON event per line."""
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if isinstance(event, dict):
            yield event


class Waker:
    """What wakes the supervisor's loop: a fencing change (from the watch thread) or a signal.

    A ``threading.Event`` is not safe here: a Python signal handler runs in the main thread
    between two bytecodes, possibly while that thread is inside ``Event.wait`` holding the
    event's lock, and ``Event.set`` in the handler then waits for that lock forever (PID 1
    hung, Patroni's exit and the runtime's SIGTERM unnoticed). ``set`` writes a byte to a
    non-blocking pipe, which takes no lock; ``wait`` selects on the pipe."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe is set already
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self.wait(0)

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def wait(self, timeout: float | None = None) -> bool:
        readable, _, _ = select.select([self._read], [], [], timeout)
        return bool(readable)


class FencingSource:
    """The fencing state of one pod, kept current by a watch on ``NAME-fencing``."""

    def __init__(self, namespace: str, cluster: str, pod: str, state_file: Path) -> None:
        self.namespace, self.pod = namespace, pod
        self.name = f"{cluster}{FENCING_SUFFIX}"
        self.state_file = state_file
        self.changed = Waker()
        self.known = threading.Event()
        self._fenced = state_file.exists()
        if self._fenced:
            self.known.set()

    @property
    def fenced(self) -> bool:
        return self._fenced

    def _set(self, fenced: bool) -> None:
        if fenced:
            self.state_file.write_text("fenced\n")
        else:
            self.state_file.unlink(missing_ok=True)
        if fenced != self._fenced:
            self._fenced = fenced
            print(
                f"stateward-instance: {self.pod} {'fenced' if fenced else 'unfenced'}"
                f" ({self.name})",
                file=sys.stderr,
                flush=True,
            )
            self.changed.set()
        self.known.set()

    def _request(self, query: dict[str, str], timeout: float) -> Any:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        url = (
            f"https://{host}:{port}/api/v1/namespaces/{self.namespace}/configmaps"
            f"?{urllib.parse.urlencode(query)}"
        )
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        return urllib.request.urlopen(request, timeout=timeout, context=context)  # noqa: S310

    def run(self, stop: threading.Event) -> None:
        """List, then watch from that version; on any error keep the last state and retry."""
        selector = {"fieldSelector": f"metadata.name={self.name}"}
        delay = 1.0
        while not stop.is_set():
            try:
                with self._request(selector, timeout=10) as response:
                    listed = json.load(response)
                items = listed.get("items") or []
                self._set(fenced_in(items[0].get("data") if items else None, self.pod))
                version = listed["metadata"]["resourceVersion"]
                query = {**selector, "watch": "1", "resourceVersion": version}
                query["timeoutSeconds"] = "300"
                with self._request(query, timeout=330) as stream:
                    delay = 1.0
                    for event in watch_events(stream):
                        if event.get("type") == "ERROR":
                            break
                        obj = event.get("object") or {}
                        gone = event.get("type") == "DELETED"
                        self._set(fenced_in(None if gone else obj.get("data"), self.pod))
                        if stop.is_set():
                            return
            except (OSError, ValueError, KeyError, urllib.error.URLError) as error:
                print(
                    f"stateward-instance: cannot read {self.name} ({type(error).__name__});"
                    f" keeping {'fenced' if self._fenced else 'unfenced'}, retrying",
                    file=sys.stderr,
                    flush=True,
                )
                stop.wait(delay)
                delay = min(delay * 2, 10.0)


class _FencedProbes(http.server.BaseHTTPRequestHandler):
    """Patroni's probe paths while Patroni is stopped: alive, not ready."""

    def do_GET(self) -> None:
        alive = self.path.startswith("/liveness")
        self.send_response(200 if alive else 503)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"fenced\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Unfenced:
    """The fencing source of a process that is never fenced (PgBouncer, in a pooler pod)."""

    fenced: Final = False

    def __init__(self) -> None:
        self.changed = Waker()
        self.known = threading.Event()
        self.known.set()


class Supervisor:
    """Runs ``argv`` (Patroni) unless fenced; see the module docstring."""

    def __init__(
        self,
        argv: Sequence[str],
        source: FencingSource | Unfenced,
        *,
        port: int,
        spawn: Callable[[Sequence[str]], subprocess.Popen[bytes]] = subprocess.Popen,
        first_read_timeout: float = 10.0,
        certificate: Certificate | None = None,
        clock: Callable[[], float] = time.monotonic,
        signals: Mapping[int, int] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.source = source
        self.signals = dict(signals or {})
        """A signal of the runtime's to send the child as another (default: as it is)."""
        self.port = port
        self.certificate = certificate
        self.clock = clock
        self._certificate_checked = clock()
        self.spawn = spawn
        self.first_read_timeout = first_read_timeout
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self._terminating = False
        self._probes: http.server.HTTPServer | None = None

    def _signal(self, signum: int, _frame: Any) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(self.signals.get(signum, signum))
        self.source.changed.set()

    def _serve_probes(self, on: bool) -> None:
        if on and self._probes is None:
            server = http.server.ThreadingHTTPServer(("0.0.0.0", self.port), _FencedProbes)  # noqa: S104
            server.daemon_threads = True
            if self.certificate is not None:
                # The handshake happens in the handler's thread, so a client that never
                # completes one holds no other probe.
                server.socket = self.certificate.server_context().wrap_socket(
                    server.socket, server_side=True, do_handshake_on_connect=False
                )
            self._probes = server
            threading.Thread(target=server.serve_forever, daemon=True).start()
        elif not on and self._probes is not None:
            self._probes.shutdown()
            self._probes.server_close()
            self._probes = None

    def _reap(self) -> None:
        """Collect orphans reparented to PID 1 (never the child: Popen waits for it)."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child is not None and pid == self.child.pid:
                self.child.returncode = os.waitstatus_to_exitcode(_status)
                return

    def _check_certificate(self) -> None:
        """A renewed certificate: Patroni reloads it (and has PostgreSQL reload), the fenced
        probes serve it."""
        if self.certificate is None:
            return
        now = self.clock()
        if now - self._certificate_checked < CERTIFICATE_CHECK_INTERVAL:
            return
        self._certificate_checked = now
        if not self.certificate.changed():
            return
        print("stateward-instance: the serving certificate changed; reloading", file=sys.stderr)
        if self.child is not None and self.child.poll() is None and not self._terminating:
            self.child.send_signal(signal.SIGHUP)
        if self._probes is not None:
            self._serve_probes(False)
            self._serve_probes(True)

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, self._signal)
        signal.signal(signal.SIGCHLD, lambda _s, _f: self.source.changed.set())
        self.source.known.wait(self.first_read_timeout)
        while True:
            self.source.changed.clear()
            self._reap()
            child = self.child
            if child is not None and child.poll() is not None:
                code = child.returncode
                self.child = None
                self._terminating = False
                if self.stopping or not self.source.fenced:
                    # Patroni ended on its own (or by the runtime's signal): so does the
                    # container, as when Patroni was PID 1.
                    self._serve_probes(False)
                    return 128 - code if code < 0 else code
                print("stateward-instance: Patroni stopped for fencing", file=sys.stderr)
            if self.stopping and self.child is None:
                self._serve_probes(False)
                return 0
            if self.source.fenced:
                if self.child is not None and not self._terminating:
                    self._terminating = True
                    self.child.send_signal(signal.SIGTERM)  # a clean shutdown, lock handed over
                elif self.child is None:
                    self._serve_probes(True)
            elif self.child is None:
                self._serve_probes(False)
                self.child = self.spawn(self.argv)
            self._check_certificate()
            self.source.changed.wait(1.0)


def supervise(
    argv: Sequence[str],
    *,
    namespace: str,
    cluster: str,
    pod: str,
    port: int,
    certificate: Certificate | None = None,
    metrics_from: tuple[str, str] | None = None,
    waker: wakeup.Waker | None = None,
) -> int:
    """Run ``argv`` (Patroni) supervised; with ``metrics_from`` (psql, the data directory)
    also serve the instance's metrics (:mod:`stateward.instance.metrics`) and make the
    pooler's lookup function once PostgreSQL answers (:mod:`stateward.instance.pooler`);
    with ``waker``, wake Patroni's HA loop when a WAL sender ends
    (:mod:`stateward.instance.wakeup`)."""
    if metrics_from is not None:
        try:
            metrics.serve(*metrics_from)
        except OSError as error:  # the database matters more than its metrics
            print(f"stateward-instance: metrics not served: {error}", file=sys.stderr)
    source = FencingSource(namespace, cluster, pod, Path("/tmp") / STATE_FILE_NAME)  # noqa: S108
    stop = threading.Event()
    threading.Thread(target=source.run, args=(stop,), daemon=True).start()
    if metrics_from is not None:
        pooler.ensure_in_background(metrics_from[0], stop)
        upgrade.upgrade_stanza_in_background(*metrics_from, stop)
    if waker is not None:
        wakeup.watch_in_background(waker, stop)
    try:
        return Supervisor(argv, source, port=port, certificate=certificate).run()
    finally:
        stop.set()


POOLER_SIGNALS: Final[Mapping[int, int]] = {signal.SIGTERM: signal.SIGINT}
"""The runtime's stop request, as PgBouncer's safe shutdown (see :func:`supervise_pooler`)."""


def supervise_pooler(argv: Sequence[str], *, certificate: Certificate) -> int:
    """Run ``argv`` (PgBouncer) as PID 1 does, reloading it (SIGHUP: it re-reads its
    configuration and TLS files) when the mounted certificate is renewed. The runtime's
    SIGTERM becomes PgBouncer's SIGINT, its safe shutdown: no new clients, the transactions
    running finish, then it exits (its SIGTERM would wait for every client to leave, which
    pooled applications never do)."""
    return Supervisor(
        argv,
        Unfenced(),
        port=0,  # never fenced: no probes of its own to serve
        certificate=certificate,
        signals=POOLER_SIGNALS,
    ).run()
