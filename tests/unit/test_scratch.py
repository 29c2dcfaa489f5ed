"""The process's scratch: its own directories, what a killed process left removed at start, jars read in
place in local mode (service/scratch.py, service/spark_jars.resolve)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import scratch
from service.config import SparkConfig
from service.spark_jars import resolve


@pytest.fixture(autouse=True)
def no_scratch_yet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(scratch, "_current", None)
    yield
    made = scratch.current()
    if made is not None:
        made.release()


def _holder(base: Path) -> subprocess.Popen[str]:
    """Another process that claims scratch under ``base`` and keeps running; its directory's path on stdout."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from service import scratch
        from service.config import SparkConfig
        made = scratch.claim(SparkConfig(), {{"SPARK_LOCAL_DIRS": {str(base)!r}}})
        print(made.root, flush=True)
        time.sleep(120)
        """
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_dead_processs_scratch_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    live = _holder(tmp_path)
    dead = _holder(tmp_path)
    try:
        assert live.stdout is not None and dead.stdout is not None
        live_dir, dead_dir = Path(live.stdout.readline().strip()), Path(dead.stdout.readline().strip())
        (dead_dir / "spark-1" / "userFiles-1").mkdir(parents=True)
        (dead_dir / "spark-1" / "userFiles-1" / "big.jar").write_bytes(b"x" * 1000)
        dead.kill()  # SIGKILL: no atexit, the directory stays with its lock file
        assert dead.wait() == -9 and dead_dir.is_dir()
        foreign = tmp_path / "spark-0123"  # not this service's: never touched
        foreign.mkdir()
        unlocked = tmp_path / "icesink-being-made"  # no lock file yet: left alone
        unlocked.mkdir()

        made = scratch.claim(SparkConfig(), {"SPARK_LOCAL_DIRS": str(tmp_path)})

        assert not dead_dir.exists()
        assert live_dir.is_dir() and foreign.is_dir() and unlocked.is_dir()
        assert made.root.parent == tmp_path and made.root.name.startswith(f"icesink-{os.getpid()}-")
    finally:
        live.kill()
        dead.kill()
        live.wait()
        dead.wait()


def test_claim_points_spark_at_the_processs_own_directories_once(tmp_path: Path) -> None:
    environ = {"SPARK_LOCAL_DIRS": f"{tmp_path / 'a'},{tmp_path / 'b'}"}
    made = scratch.claim(SparkConfig(), environ)
    assert [d.parent for d in made.directories] == [tmp_path / "a", tmp_path / "b"]
    assert environ["SPARK_LOCAL_DIRS"] == ",".join(str(d) for d in made.directories)
    assert scratch.claim(SparkConfig(), environ) is made  # a process's Spark starts once
    made.release()
    assert not any(d.exists() for d in made.directories)


def test_spark_local_dir_then_the_temporary_directory_when_the_variable_is_unset(tmp_path: Path) -> None:
    spark = SparkConfig(conf={"spark.local.dir": str(tmp_path)})
    assert scratch.base_directories(spark, {}) == [tmp_path]
    assert scratch.base_directories(SparkConfig(), {})[0].is_dir()


def test_local_mode_reads_jar_files_in_place_and_other_masters_ship_them(tmp_path: Path) -> None:
    jars = [str(tmp_path / "a.jar"), str(tmp_path / "b.jar")]
    environ = {"ICESINK_SPARK_JARS": ",".join(jars)}
    local = resolve(SparkConfig(), environ, local=True)
    assert local.conf == {"spark.driver.extraClassPath": os.pathsep.join(jars)} and local.on_class_path
    assert "spark.driver.extraClassPath" in local.describe()
    cluster = resolve(SparkConfig(), environ, local=False)
    assert cluster.conf == {"spark.jars": ",".join(jars)} and not cluster.on_class_path
    # Spark's own settings are used as given; a class path of the user's own is not replaced.
    given = resolve(SparkConfig(conf={"spark.jars": jars[0]}), environ, local=True)
    assert given.conf == {"spark.jars": jars[0]}
    theirs = SparkConfig(conf={"spark.driver.extraClassPath": "/x.jar"})
    assert resolve(theirs, environ, local=True).conf == {"spark.jars": ",".join(jars)}
    # With Ivy's packages (in Spark's own loader) the files go there too: one loader sees both.
    packages = resolve(SparkConfig(conf={"spark.jars.packages": "org.example:a:1"}), environ, local=True)
    assert packages.conf == {"spark.jars": ",".join(jars)}
    remote = resolve(SparkConfig(jars=["https://repo.example/a.jar"]), {}, local=True)
    assert remote.conf == {"spark.jars": "https://repo.example/a.jar"}


def test_the_driver_jvms_temporary_directory_is_the_scratch(tmp_path: Path) -> None:
    own = scratch.Scratch([tmp_path / "icesink-1-abc"], [])
    assert scratch.with_java_tmpdir(None, own) == f"-Djava.io.tmpdir={tmp_path / 'icesink-1-abc'}"
    assert scratch.with_java_tmpdir("-XX:+UseSerialGC", own).startswith("-XX:+UseSerialGC -Djava.io.tmpdir=")
    assert scratch.with_java_tmpdir("-Djava.io.tmpdir=/mine", own) == "-Djava.io.tmpdir=/mine"  # theirs kept
