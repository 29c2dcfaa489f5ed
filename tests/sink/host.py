"""A warm Spark session for the sink tests: ``icesink run`` and ``maintain --once`` in a long-lived process.

Most of a test's ``icesink run`` or ``icesink maintain --once`` is a new Python process, a new JVM and
a new Spark session. Each pytest worker starts one *sink host* instead (``python -m tests.sink.host``,
on first use, kept for the session): it runs the command in-process with :func:`service.cli.main`, the
CLI's own entry point, so the exit code is the one the command would have exited with (an exception
the CLI lets out is printed and answers 1, as Python's exit would). The host starts its Spark session
as ``maintain`` starts one (with Iceberg's SQL extensions, which a session takes only when it starts);
a command's ``build_spark`` finds it and reuses it, and the session outlives the command (``maintain``'s
stop of it is skipped). ``Sink.start`` runs ``run`` there in the background, ``Sink.cli`` runs it to
its end, with ``maintain --once`` and the commands that start no Spark (status, orphans, txnlog
reseed/abandon, offsets reset), their output captured as ``subprocess.run`` captures it.

What a run leaves in the process is put back after it: the signal handlers the CLI installs, the
logging set-up, the fail points, Spark's cached data, the Spark settings it added (the maintainer's
catalog, its default catalog), the Iceberg catalogs Spark made of them (dropped, not closed) and the
py4j callbacks it registered (let go, and its job, Kafka clients included, with them).
Everything the process, its JVM and its Spark Python workers write goes through one pipe, copied to
the log file of the run in progress (the file a subprocess would have written), or to the host's own
log between runs.

A run is a process, as before, when
* the test gives it variables of its own (a fail point, a credential, no jar list, ...);
* the host is busy with another run (two sinks started at once);
* its configuration does not load, exports metrics, serves health probes, runs on a cluster, or names
  other Spark settings (master, jars, conf) than the run that started the host's session;
* the test asks for a process (``Sink.start(process=True)``): a run it SIGKILLs as its story;
* it is the long-running ``maintain`` (a test signals it, probes its health) or ``check``, which may
  start a Spark session of another master and ends its process at once after a check it gave up on.
The host runs with the pytest process's environment, as a sink process would; it is started again
when that changes (the ``spark`` fixture's Spark sets variables). A hosted run a test stops gets the
CLI's own SIGTERM handler; a SIGKILL can only be approximated (a stop, then the host is killed if the
run does not end within a minute), which is why a test whose fault is a kill starts a process.

``ICESINK_TEST_SINK_HOST=0`` turns the host off: every run is a process. ``ICESINK_TEST_SINK_HOST_KEEP=1``
keeps the host's log (its directory under the temporary directory), which names every run and decline.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import logging
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from unittest import mock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]
ENABLED = os.environ.get("ICESINK_TEST_SINK_HOST", "1") != "0"
# What the host runs: ``icesink run``, with ``--until-caught-up`` or not (its output to the run's log
# file, as a process writes it), and, their output returned as ``subprocess.run`` with
# ``capture_output`` returns it, the commands that start no Spark and one pass of maintenance
# (``maintain --once``, in the host's session).
HOSTED_RUN = ("run", "--until-caught-up")
HOSTED_COMMANDS = (
    ("status",),
    ("orphans",),
    ("txnlog", "reseed"),
    ("txnlog", "abandon"),
    ("offsets", "reset"),
    ("maintain", "--once"),
)
# The commands the host's Spark session serves: run, and one pass of maintenance.
SPARK_COMMANDS = ("run", "maintain")
# Variables that change from test to test in a pytest process: not part of what a run sees.
VOLATILE_ENV = ("PYTEST_CURRENT_TEST",)
KILLED = -signal.SIGKILL


def _comparable(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in VOLATILE_ENV}


def hosted(argv: list[str], capture: bool) -> bool:
    """Whether ``icesink <argv>`` is one the host runs: ``run`` (with ``--until-caught-up`` or not);
    with ``capture`` (run to its end, its output returned) also ``maintain --once`` and the commands
    that start no Spark."""
    if argv[-2:-1] != ["--config"]:
        return False
    command = tuple(argv[:-2])
    if command in (HOSTED_RUN, ("run",)):
        return True
    return capture and any(command[: len(c)] == c for c in HOSTED_COMMANDS)


# -- the host process ---------------------------------------------------------------------------------


class _Output:
    """The process's stdout and stderr, and so its JVM's and Spark's Python workers': one pipe whose
    reader copies what comes to the current run's log file, or to the host's log between runs.

    A switch is a marker written into the pipe, so that everything written before it lands in the
    file it was written for."""

    MARK = b"\x00icesink-sink-host-switch\x00"

    def __init__(self, host_log: Path) -> None:
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self._read = read
        self._host_log: BinaryIO = host_log.open("ab", buffering=0)
        self._target: BinaryIO = self._host_log
        self._next: queue.Queue[BinaryIO] = queue.Queue()
        self._switched: queue.Queue[BinaryIO] = queue.Queue()
        threading.Thread(target=self._copy, name="sink-host-output", daemon=True).start()

    def _copy(self) -> None:
        pending = b""
        while chunk := os.read(self._read, 1 << 16):
            data = pending + chunk
            while (at := data.find(self.MARK)) >= 0:
                self._target.write(data[:at])
                self._switched.put(self._target)
                self._target = self._next.get()
                data = data[at + len(self.MARK) :]
            # Keep back only a tail that may be the start of a marker split between two reads.
            keep = next(
                (
                    k
                    for k in range(min(len(self.MARK) - 1, len(data)), 0, -1)
                    if self.MARK.startswith(data[-k:])
                ),
                0,
            )
            self._target.write(data[: len(data) - keep])
            pending = data[len(data) - keep :]

    def switch(self, target: BinaryIO | None) -> BinaryIO:
        """Send what is written from now on to ``target`` (None: the host's log); returns the file
        written to until now, once all of it is there."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._next.put(target or self._host_log)
        os.write(2, self.MARK)
        return self._switched.get(timeout=60)


class _Logging:
    """What the CLI's logging set-up (service.logs) changes, put back after each run as a fresh
    process has it: the root logger's level and handlers, and the levels it gives the libraries."""

    NAMES = ("py4j", "pyiceberg", "urllib3", "botocore", "s3fs", "fsspec")

    def __init__(self) -> None:
        root = logging.getLogger()
        self._root = (root.level, list(root.handlers))
        self._levels = {name: logging.getLogger(name).level for name in self.NAMES}

    def restore(self) -> None:
        root = logging.getLogger()
        root.setLevel(self._root[0])
        root.handlers[:] = self._root[1]
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


class _Host:
    def __init__(self, address: str, host_log: Path) -> None:
        self.env = _comparable(os.environ)
        self.output = _Output(host_log)
        self.spark_key: str | None = None  # the Spark settings of the runs this host's session serves
        self.busy = threading.Lock()
        self.current: str | None = None  # the id of the run in progress
        self.requests: queue.Queue[tuple[socket.socket, dict[str, Any]] | None] = queue.Queue()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(address)
        self.server.listen(8)
        # What a run needs, imported before the first one, and the logging state they leave.
        import service.cli
        import service.job

        self.cli = service.cli
        self.logging = _Logging()
        self.handlers: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def note(self, message: str) -> None:
        print(f"sink host: {message}", file=sys.stderr, flush=True)

    # The listener thread answers at once what needs no run; runs go to the main thread, which
    # alone may install signal handlers.
    def listen(self) -> None:
        while True:
            conn, _ = self.server.accept()
            try:
                request = _receive(conn)
            except (OSError, ValueError):
                request = None
            if request is None:
                conn.close()
                continue
            op = request.get("op")
            if op == "run":
                if self.busy.acquire(blocking=False):
                    self.requests.put((conn, request))
                else:
                    _send(conn, {"accepted": False, "reason": "busy with another run"})
                    conn.close()
            elif op == "signal":
                _send(conn, {"delivered": self.deliver(request["id"], int(request["signum"]))})
                conn.close()
            elif op == "exit":
                self.requests.put(None)
                conn.close()

    def deliver(self, run_id: str, signum: int) -> bool:
        """Call the handler the run installed for ``signum``, as the signal would."""
        if self.current != run_id:
            return False
        handler = signal.getsignal(signum)
        if not callable(handler) or handler is self.handlers.get(signum):
            return False
        handler(signum, None)
        return True

    def serve(self) -> None:
        threading.Thread(target=self.listen, name="sink-host-listener", daemon=True).start()
        parent = os.getppid()
        while True:
            try:
                item = self.requests.get(timeout=5)
            except queue.Empty:
                if os.getppid() != parent:  # the pytest process is gone
                    return
                continue
            if item is None:
                return
            conn, request = item
            try:
                self.handle(conn, request)
            except Exception:
                self.note(f"a run failed in the host itself:\n{traceback.format_exc()}")
                with contextlib.suppress(OSError):
                    _send(conn, {"code": 1})
            finally:
                conn.close()
                self.current = None
                self.busy.release()
            if not self.session_alive():
                self.note("the Spark session is gone: exiting, the next run starts a new host")
                return

    def declines(self, request: dict[str, Any]) -> str | None:
        """Why the host does not run this request (the test then starts a process), or None."""
        from service.config import ConfigError, load_config
        from service.spark_session import ICEBERG_EXTENSIONS, is_local

        argv, capture = request["argv"], bool(request.get("capture"))
        if not hosted(argv, capture):
            return "not a command the host runs"
        env = _comparable(request["env"])
        if env != self.env:
            changed = sorted(k for k in {*env, *self.env} if env.get(k) != self.env.get(k))
            return f"its environment differs from the host's: {', '.join(changed)}"
        if argv[0] not in SPARK_COMMANDS:
            return None
        try:
            config = load_config(argv[-1])
        except ConfigError as exc:
            return f"its configuration does not load ({exc})"
        if config.metrics.prometheus_port is not None or config.metrics.otlp_endpoint:
            return "it exports metrics"
        if config.health.port is not None:
            return "it serves health probes"
        if not is_local(config.spark.master):
            return f"it runs on a cluster ({config.spark.master}): an application of its own, ended with it"
        spark = config.spark.model_dump(exclude={"app_name", "checkpoint_dir"})
        key = json.dumps(spark, sort_keys=True, default=str)
        if self.spark_key is not None and key != self.spark_key:
            return f"its Spark settings differ from the session's: {spark}"
        self.spark_key = key
        if argv[0] == "maintain" and ICEBERG_EXTENSIONS not in _settings().get(
            "spark.sql.extensions", ICEBERG_EXTENSIONS
        ):
            # The session started without them (the host could not start it ahead of a run).
            return "the host's Spark session has no Iceberg SQL extensions"
        return None

    def handle(self, conn: socket.socket, request: dict[str, Any]) -> None:
        from pyspark.sql import SparkSession

        os.environ["PYTEST_CURRENT_TEST"] = request["env"].get("PYTEST_CURRENT_TEST", "")
        os.chdir(request["cwd"])
        reason = self.declines(request)
        if reason:
            self.note(f"declined {request['argv']}: {reason}")
            _send(conn, {"accepted": False, "reason": reason})
            return
        self.current = request["id"]
        # Captured: Python's stdout apart, and the rest (the CLI's log, Spark's) as stderr.
        capture = bool(request.get("capture"))
        stdout, stderr = io.StringIO(), io.BytesIO()
        with contextlib.ExitStack() as stack:
            if capture:
                stack.enter_context(contextlib.redirect_stdout(stdout))
                output: BinaryIO = stderr
            else:
                output = stack.enter_context(Path(request["log"]).open("ab", buffering=0))
            self.output.switch(output)
            started = time.monotonic()
            if request["argv"][0] in SPARK_COMMANDS:
                # Before the run is accepted: a test's signal then finds the CLI's handler installed.
                self.start_session(request["argv"][-1])
                # The host's session outlives its runs (``maintain`` stops its own at the end).
                stack.enter_context(mock.patch.object(SparkSession, "stop", _kept))
            settings, proxies = _settings(), _proxy_ids()
            _send(conn, {"accepted": True})
            try:
                code = self.run(request["argv"])
            finally:
                self.output.switch(None)
                self.reset(settings, proxies)
        self.note(f"ran {request['argv']}: exit {code} after {time.monotonic() - started:.1f}s")
        answer: dict[str, Any] = {"code": code}
        if capture:
            answer |= {"stdout": stdout.getvalue(), "stderr": stderr.getvalue().decode(errors="replace")}
        _send(conn, answer)

    def start_session(self, config_path: str) -> None:
        """Start the host's Spark session before its first run, as ``icesink maintain`` starts one: with
        Iceberg's SQL extensions, which the maintenance procedures need and which a session only takes
        when it starts (a sink's run finds it and uses it as its own). If that fails, the run starts
        the session itself and says why."""
        from pyspark.sql import SparkSession

        from service.config import load_config
        from service.spark_session import build_spark

        if SparkSession._instantiatedSession is not None:
            return
        try:
            build_spark(load_config(config_path), iceberg={})
        except Exception as exc:
            self.note(f"the session did not start ahead of the run: {exc!r}")
        # What the host holds for good (the modules a run imports, the session) is out of the cyclic
        # collector's reach from here: the collection after each run walks only what runs made, not
        # ~180,000 objects (~0.3 CPU-s a run).
        gc.collect()
        gc.freeze()

    def run(self, argv: list[str]) -> int:
        """``icesink <argv>`` as the process would run it: its exit code."""
        try:
            return int(self.cli.main(argv))
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                return exc.code or 0
            print(exc.code, file=sys.stderr)
            return 1
        except BaseException:
            traceback.print_exc()
            return 1

    def reset(self, settings: dict[str, str], proxies: set[str]) -> None:
        """Put back what the run changed in the process (``settings``: the session's Spark settings
        before it; ``proxies``: py4j's callback objects then), and let go of what it left."""
        from pyspark.sql import SparkSession

        from service import failpoints

        for signum, handler in self.handlers.items():
            signal.signal(signum, handler)
        self.logging.restore()
        failpoints.configure("")
        # A run's job (its Kafka clients: threads, sockets; its txnlog) is held by py4j's pool of the
        # Python objects the JVM calls back (the run's foreachBatch function; a maintenance pass's
        # callbacks) until the JVM collects its handles on them, which a young collection seldom does
        # once they outlived a few. The run's entries are let go here, and the collection frees the
        # job. (A full JVM collection after each run did the same for ~0.23 s of the JVM's CPU: ~70
        # of them in 11 minutes of a suite's host.)
        _release_proxies(proxies)
        gc.collect()
        session = SparkSession._instantiatedSession
        if session is None or session._jvm is None:
            return
        with contextlib.suppress(Exception):
            session.catalog.clearCache()
        # A maintenance pass's Iceberg catalog (``icesink``, or a SQL catalog's own name) and the
        # settings it came from (``spark.sql.catalog.<name>.*``, ``spark.sql.defaultCatalog``): unset
        # and dropped, so that the next pass makes its own of its own settings. Spark drops a catalog
        # without closing it (Iceberg's caching wrapper has no close): its clients stay open until the
        # host exits.
        for key, value in _settings().items():
            with contextlib.suppress(Exception):
                if key not in settings:
                    session.conf.unset(key)
                elif value != settings[key]:
                    session.conf.set(key, settings[key])
        with contextlib.suppress(Exception):
            session._jsparkSession.sessionState().catalogManager().reset()

    def session_alive(self) -> bool:
        from pyspark.sql import SparkSession

        session = SparkSession._instantiatedSession
        if session is None:
            return True  # none yet (the runs so far stopped before Spark started)
        try:
            return not session.sparkContext._jsc.sc().isStopped()
        except Exception:
            return False


def _proxy_pool() -> Any:
    """py4j's pool of the Python objects this process's JVM calls back, or None before the JVM starts."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    return None if gateway is None else gateway.gateway_property.pool


def _proxy_ids() -> set[str]:
    pool = _proxy_pool()
    if pool is None:
        return set()
    with pool.lock:
        return set(pool.dict)


def _release_proxies(kept: set[str]) -> None:
    """Let go of the callback objects py4j took since ``kept`` (a run's, which ended: nothing calls
    them again). Each stays in the pool as None: when the JVM collects its handle, py4j removes the
    entry, and one it could not find it would log as a warning."""
    pool = _proxy_pool()
    if pool is None:
        return
    with pool.lock:
        for key in pool.dict.keys() - kept:
            pool.dict[key] = None


def _settings() -> dict[str, str]:
    """The host's Spark session's settings (none before it starts)."""
    from pyspark.sql import SparkSession

    session = SparkSession._instantiatedSession
    return dict(session.conf.getAll) if session is not None and session._jvm is not None else {}


def _kept(session: SparkSession) -> None:
    """``SparkSession.stop`` during a hosted run: the session is the host's."""


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _receive(conn: socket.socket) -> dict[str, Any] | None:
    """One message (a line of JSON), read without reading past it; None if the peer closed first."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            return None
        line += byte
    message: dict[str, Any] = json.loads(line)
    return message


def main() -> None:
    address, host_log = sys.argv[1], Path(sys.argv[2])
    host = _Host(address, host_log)
    try:
        host.serve()
    finally:
        host.note("exiting")
        os._exit(0)  # the JVM exits when its gateway's connection closes


# -- the client (the pytest process) --------------------------------------------------------------------


class HostedProcess:
    """A run in the sink host, with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, host: SinkHost, conn: socket.socket, run_id: str, args: list[str]) -> None:
        self._host = host
        self._conn = conn
        self._id = run_id
        self.args = args
        self.returncode: int | None = None
        self.stdout = self.stderr = ""  # a command's output (``capture``)

    def _answer(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return None
        answer = _receive(self._conn)
        self._conn.close()
        # No answer: the host died under the run (as a killed process would).
        self.returncode = KILLED if answer is None else int(answer["code"])
        self.stdout, self.stderr = (answer or {}).get("stdout", ""), (answer or {}).get("stderr", "")
        return self.returncode

    def poll(self) -> int | None:
        return self._answer(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._answer(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        """The signal, as the sink process would get it. SIGKILL can't be delivered to one run: the run
        is asked to stop (SIGTERM's graceful path), and the host is killed if it does not within a
        minute."""
        if self.poll() is not None:
            return
        if signum != signal.SIGKILL:
            self._host.signal(self._id, signum)
            return
        self._host.signal(self._id, signal.SIGTERM)
        try:
            self.wait(60)
        except subprocess.TimeoutExpired:
            self._host.stop(kill=True)
            self.wait(30)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class SinkHost:
    """The pytest process's side of its sink host, started on first use."""

    def __init__(self) -> None:
        # Its socket and log; ICESINK_TEST_SINK_HOST_KEEP=1 keeps the log (it says what each run did).
        self._dir = Path(tempfile.mkdtemp(prefix="icesink-sink-host-"))
        self.address = str(self._dir / "socket")
        self.log = self._dir / "host.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}  # the host's environment
        self.active: HostedProcess | None = None  # the last run started in it

    def _note(self, message: str) -> None:
        with self.log.open("a") as log:
            print(f"sink host: {message}", file=log)

    def _ensure(self, env: Mapping[str, str]) -> bool:
        """A host running with ``env``, the environment a sink process would get: started if there is
        none, or again if the pytest process's environment changed since (the ``spark`` fixture's
        Spark sets variables). False if that would end a run in progress."""
        if self.process is not None and self.process.poll() is None:
            wanted = _comparable(env)
            if wanted == self.env:
                return True
            if self.active is not None and self.active.poll() is None:
                return False
            changed = sorted(k for k in {*wanted, *self.env} if wanted.get(k) != self.env.get(k))
            self._note(f"the environment changed ({', '.join(changed)}): starting another host")
            self.stop()
        elif self.process is not None:
            self._note(f"the host exited ({self.process.returncode}); starting another")
        self.env = _comparable(env)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.sink.host", self.address, str(self.log)],
            cwd=REPO,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while not os.path.exists(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sink host did not start; its log:\n{self._log_tail()}")
            time.sleep(0.05)
        return True

    def pid(self) -> int:
        """The host process's pid (started if there is none)."""
        self._ensure(os.environ)
        assert self.process is not None
        return self.process.pid

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no log)"

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + 10
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(self.address)
                return conn
            except ConnectionRefusedError:  # bound, not yet listening
                conn.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def start(
        self, argv: list[str], env: Mapping[str, str], cwd: Path, log: Path | None
    ) -> HostedProcess | None:
        """Start ``icesink <argv>`` in the host, logging to ``log`` (None: its output is returned);
        None if the host declines it."""
        if not self._ensure(env):
            return None
        run_id = uuid.uuid4().hex
        conn = self._connect()
        request = {
            "op": "run",
            "id": run_id,
            "argv": argv,
            "env": dict(env),
            "cwd": str(cwd),
            "log": str(log),
            "capture": log is None,
        }
        _send(conn, request)
        answer = _receive(conn)
        if answer is None or not answer["accepted"]:
            conn.close()
            return None
        self.active = HostedProcess(self, conn, run_id, argv)
        return self.active

    def signal(self, run_id: str, signum: int) -> None:
        with contextlib.suppress(OSError), contextlib.closing(self._connect()) as conn:
            _send(conn, {"op": "signal", "id": run_id, "signum": signum})
            _receive(conn)

    def close(self) -> None:
        """Stop the host and remove its directory (the pytest process ends)."""
        self.stop()
        if os.environ.get("ICESINK_TEST_SINK_HOST_KEEP") != "1":
            shutil.rmtree(self._dir, ignore_errors=True)

    def stop(self, kill: bool = False) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        if not kill:
            with contextlib.suppress(OSError), contextlib.closing(self._connect()) as conn:
                _send(conn, {"op": "exit"})
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


_the_host: SinkHost | None = None


def _host() -> SinkHost:
    global _the_host
    if _the_host is None:
        _the_host = SinkHost()
        atexit.register(_the_host.close)
    return _the_host


def start(argv: list[str], env: Mapping[str, str], log: Path, cwd: Path = REPO) -> HostedProcess | None:
    """``icesink <argv>`` in this pytest process's sink host, writing to ``log``, or None: the caller
    starts a process."""
    if not ENABLED or not hosted(argv, capture=False):
        return None
    return _host().start(argv, env, cwd, log)


def run(
    argv: list[str], env: Mapping[str, str], timeout: float, cwd: Path = REPO
) -> subprocess.CompletedProcess[str] | None:
    """``icesink <argv>`` run to its end in the sink host, its output captured, or None: the caller
    runs a process."""
    if not ENABLED or not hosted(argv, capture=True):
        return None
    process = _host().start(argv, env, cwd, None)
    if process is None:
        return None
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return subprocess.CompletedProcess(argv, code, process.stdout, process.stderr)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Every run a process (tests whose sinks are killed at random: the chaos suite)."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


if __name__ == "__main__":
    main()
