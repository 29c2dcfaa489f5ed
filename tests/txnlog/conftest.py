"""Fixtures for the txnlog tests. They run against a real Postgres named by ICESINK_PG_DSN.

A missing or unreachable database is a test *failure*, never a skip: a green run must mean the
protocol was exercised. Restart tests also need a way to restart that server (see
``restart_postgres``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from txnlog import RetryPolicy, TransactionLog

DSN_ENV = "ICESINK_PG_DSN"
RESTART_ENV = "ICESINK_PG_RESTART_CMD"
REPO = Path(__file__).resolve().parents[2]
DEV_STACK = REPO / "dev" / "stack"
WORKER = Path(__file__).with_name("_txnlog_worker.py")

# Fast settings for tests: short waits, quick retries, a deadline that still outlives a restart.
FAST_RETRY = RetryPolicy(
    max_attempts=200,
    deadline=timedelta(seconds=45),
    initial_backoff=timedelta(milliseconds=5),
    max_backoff=timedelta(milliseconds=500),
)


def _url(dsn: str) -> URL:
    url = make_url(dsn)
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _dsn_from_dev_stack() -> str | None:
    """ICESINK_PG_DSN as `dev/stack env` prints it (what `make test` relies on), if the stack exists."""
    if not DEV_STACK.exists():
        return None
    res = subprocess.run([str(DEV_STACK), "env"], capture_output=True, text=True, timeout=60)
    for line in res.stdout.splitlines():
        match = re.fullmatch(rf"export {DSN_ENV}=(.*)", line.strip())
        if match:
            return shlex.split(match[1])[0]
    return None


@pytest.fixture(scope="session")
def txnlog_dsn() -> str:
    """ICESINK_PG_DSN, else the dev stack's DSN (as the root conftest does); never a skip."""
    dsn = os.environ.get(DSN_ENV) or _dsn_from_dev_stack()
    if not dsn:
        pytest.fail(
            f"{DSN_ENV} is not set and `dev/stack env` did not provide it. The txnlog tests need a real "
            f"Postgres: run `dev/stack up`, or point {DSN_ENV} at any Postgres >= 14.",
            pytrace=False,
        )
    url = _url(dsn)
    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        pytest.fail(
            f"Postgres at {url.render_as_string(hide_password=True)} is unreachable "
            f"({type(exc).__name__}: {getattr(exc, 'orig', exc)}); start it with `dev/stack up`",
            pytrace=False,
        )
    finally:
        engine.dispose()
    return dsn


@pytest.fixture(scope="session")
def admin_engine(txnlog_dsn: str) -> Iterator[Any]:
    engine = create_engine(_url(txnlog_dsn), pool_pre_ping=True)
    yield engine
    engine.dispose()


def _drop_schema(engine: Any, schema: str) -> None:
    for _ in range(3):
        try:
            with engine.begin() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            return
        except Exception:  # e.g. the server is still coming back from a restart test
            time.sleep(1)


@pytest.fixture
def txnlog_schema(admin_engine: Any) -> Iterator[str]:
    """A fresh schema per test, dropped afterwards, so tests never see each other's rows."""
    schema = f"txnlog_t_{uuid.uuid4().hex[:10]}"
    yield schema
    _drop_schema(admin_engine, schema)


MakeLog = Callable[..., TransactionLog]


@pytest.fixture
def make_log(txnlog_dsn: str, txnlog_schema: str) -> Iterator[MakeLog]:
    """Factory for logs on the test's schema; keyword arguments override the fast defaults."""
    made: list[TransactionLog] = []

    def make(**overrides: Any) -> TransactionLog:
        kwargs: dict[str, Any] = {
            "schema": txnlog_schema,
            "lock_timeout": timedelta(seconds=5),
            "idle_in_transaction_timeout": timedelta(seconds=30),
            "statement_timeout": timedelta(seconds=10),
            "connect_timeout": timedelta(seconds=3),
            "retry": FAST_RETRY,
            "application_name": "icesink-txnlog-tests",
        }
        kwargs.update(overrides)
        log = TransactionLog(txnlog_dsn, **kwargs)
        made.append(log)
        return log

    yield make
    for log in made:
        log.close()


@pytest.fixture
def log(make_log: MakeLog) -> TransactionLog:
    return make_log()


@pytest.fixture
def sink_id() -> str:
    return f"sink-{uuid.uuid4().hex[:8]}"


# -- restarting Postgres ---------------------------------------------------------------------------


def _dev_stack_port() -> int:
    return int(os.environ.get("ICESINK_PG_PORT", "15432"))


def _dev_stack_has_restart() -> bool:
    res = subprocess.run([str(DEV_STACK), "--help"], capture_output=True, text=True, timeout=60)
    return "restart" in res.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _restart_dev_stack_postgres() -> None:
    """Restart the dev stack's Postgres without a `restart` sub-command.

    The stack runs ``postgres`` in the foreground and tracks it by pid file, so ``pg_ctl restart``
    would leave it with a stale pid file. Instead: fast shutdown (SIGINT, as ``dev/stack down`` does)
    of the pid the stack recorded, then ``dev/stack up``, which starts what is not running.
    """
    run_dir = Path(os.environ.get("ICESINK_RUN_DIR") or REPO / ".cache" / "run")
    pidfile = run_dir / "pids" / "postgres.pid"
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pytest.fail(f"cannot restart the dev stack's Postgres: no pid in {pidfile}", pytrace=False)
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            pytest.fail(f"dev stack Postgres (pid {pid}) did not stop within 60s", pytrace=False)
        time.sleep(0.1)
    subprocess.run([str(DEV_STACK), "up"], check=True, capture_output=True, timeout=300)


def _resolve_restart(dsn: str) -> Callable[[], None]:
    command = os.environ.get(RESTART_ENV)
    if command:

        def run_command() -> None:
            subprocess.run(command, shell=True, check=True, timeout=120)

        return run_command
    if DEV_STACK.exists() and _url(dsn).port == _dev_stack_port():
        if _dev_stack_has_restart():

            def run_stack_restart() -> None:
                subprocess.run([str(DEV_STACK), "restart", "postgres"], check=True, timeout=300)

            return run_stack_restart
        return _restart_dev_stack_postgres
    pytest.fail(
        f"don't know how to restart the Postgres at {_url(dsn).render_as_string(hide_password=True)}: "
        f"set {RESTART_ENV} to a shell command that restarts it (e.g. "
        f"{shlex.quote('pg_ctl -D <datadir> restart -m fast -w')}), or use the dev stack's Postgres",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def restart_postgres(txnlog_dsn: str) -> Callable[[], None]:
    """A callable that restarts the server behind ICESINK_PG_DSN and returns once it accepts again."""
    restart = _resolve_restart(txnlog_dsn)
    url = _url(txnlog_dsn)

    def restart_and_wait() -> None:
        restart()
        engine = create_engine(url, connect_args={"connect_timeout": 2})
        deadline = time.monotonic() + 60
        try:
            while True:
                try:
                    with engine.connect() as conn:
                        conn.execute(text("SELECT 1"))
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            engine.dispose()

    return restart_and_wait


# -- worker processes ------------------------------------------------------------------------------


class Worker:
    """A txnlog worker in its own process (see _txnlog_worker.py), driven line by line over pipes.

    The DSN travels in the environment, never on the command line (where ``ps`` would show it).
    """

    def __init__(self, dsn: str, *args: str) -> None:
        env = {**os.environ, DSN_ENV: dsn, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, timeout: float = 30.0) -> str:
        """Wait for the next stdout line; it must start with ``prefix``. Returns the rest of the line."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"worker pid {self.pid} said nothing within {timeout}s") from None
        if line is None or not line.startswith(prefix):
            err = ""
            if line is None and self.proc.stderr is not None:
                self.proc.wait(timeout=10)
                err = self.proc.stderr.read()
            raise AssertionError(f"worker pid {self.pid} said {line!r}, expected {prefix!r}...\n{err}")
        return line[len(prefix) :].strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@pytest.fixture
def spawn_worker(txnlog_dsn: str) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def spawn(*args: str) -> Worker:
        worker = Worker(txnlog_dsn, *args)
        workers.append(worker)
        return worker

    yield spawn
    for worker in workers:
        if worker.proc.poll() is None:
            # A stopped (SIGSTOP) worker must be continued before it can die of SIGKILL cleanly.
            worker.proc.send_signal(signal.SIGCONT)
        worker.stop()
