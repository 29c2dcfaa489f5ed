"""Spark's jars as in any PySpark application: by Maven coordinates when no jar file is named, and a
jar that is missing or can't be resolved stops `icesink run` before it claims the sink.

The Ivy directory is the repository's cache (`.cache/ivy`, or `$ICESINK_CACHE_DIR/ivy`): empty in a
fresh clone, filled by the first run of these tests (about 14 MB from Maven Central), reused after.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyspark
import pytest

from service.cli import EXIT_CONFIG
from service.spark_jars import kafka_source_coordinates
from tests.sink.conftest import REPO, Sink
from tests.sink.expect import assert_rows
from txnlog import TransactionLog

IVY_HOME = Path(os.environ.get("ICESINK_CACHE_DIR") or REPO / ".cache") / "ivy"
NO_JAR_FILES = {"ICESINK_SPARK_JARS": None}  # unset: the sink falls back to Maven coordinates


def test_jars_resolved_by_maven_coordinates(make_sink: Any, spark: Any) -> None:
    """With neither spark.jars nor ICESINK_SPARK_JARS set, Spark fetches the Kafka source of pyspark's
    version through Ivy, and the sink lands the topic as with the jar files."""
    sink: Sink = make_sink(keys=50, spark={"conf": {"spark.jars.ivy": str(IVY_HOME)}})
    sink.produce(120)
    log = sink.run_until_caught_up(env=NO_JAR_FILES).log()

    kafka_source, _ = kafka_source_coordinates()
    _, artifact, version = kafka_source.split(":")
    scala = artifact.rsplit("_", 1)[1]  # the Scala and Spark versions of pyspark's own spark-core jar:
    assert (Path(pyspark.__file__).parent / "jars" / f"spark-core_{scala}-{version}.jar").is_file()
    # Spark's Ivy resolved it into the cache, and the session's Kafka source came from there
    assert "Spark jars: Maven coordinates (spark.jars and ICESINK_SPARK_JARS are unset): " in log
    assert f"spark.jars.packages {kafka_source} (Ivy: {IVY_HOME})" in log
    assert f"The jars for the packages stored in: {IVY_HOME}/jars" in log
    assert (IVY_HOME / "jars" / f"{kafka_source.replace(':', '_', 1).replace(':', '-')}.jar").is_file()
    assert not any(jar in log for jar in os.environ["ICESINK_SPARK_JARS"].split(","))
    assert_rows(spark, sink.table, sink.source.expected_rows())


@pytest.mark.parametrize(
    ("jars", "named"),
    [
        ({"jars": ["/nonexistent/spark-sql-kafka-0-10_2.13-4.1.3.jar"]}, "no such jar file: /nonexistent/"),
        ("kafka-clients only", "the Spark jars lack spark-sql-kafka-0-10"),
        (
            {"conf": {"spark.jars.packages": "org.example.icesink:no-such-jar_2.13:0.0.1"}},
            "could not resolve the packages org.example.icesink:no-such-jar_2.13:0.0.1",
        ),
    ],
    ids=["missing-file", "no-kafka-source", "unresolvable-coordinate"],
)
def test_missing_jar_stops_start_up_before_the_claim(
    make_sink: Any, pg_dsn: str, stack: Any, jars: dict[str, Any] | str, named: str
) -> None:
    """The sink was claimed once (epoch 1); a start with a jar it can't have exits 2 naming the jar,
    before its claim: the epoch stays 1. `icesink check` says the same."""
    sink: Sink = make_sink(columns=[{"name": "id", "type": "long", "required": True}])
    if jars == "kafka-clients only":
        jars = {"jars": [j for j in stack.spark_jars if "kafka-clients" in j]}
    assert isinstance(jars, dict)
    sink.config["spark"] = {**sink.config["spark"], **jars}
    sink.config["spark"]["conf"] = {**sink.config["spark"]["conf"], "spark.jars.ivy": str(IVY_HOME)}
    log = TransactionLog(pg_dsn)
    try:
        assert log.claim(sink.name, "test").epoch == 1

        run = sink.start(env=NO_JAR_FILES)
        code = run.wait(180)
        output = run.log()
        assert code == EXIT_CONFIG, f"exit {code}, expected {EXIT_CONFIG}:\n{output[-4000:]}"
        refusal = [line for line in output.splitlines() if "cannot start: " in line]
        assert refusal and named in refusal[-1], output[-4000:]
        assert "claimed epoch" not in output and "Traceback" not in output
        state = log.state(sink.name)
        assert state is not None and state.epoch == 1, f"the sink was claimed: {state}"
    finally:
        log.close()

    check = sink.cli("check", env=NO_JAR_FILES)
    assert check.returncode == 1 and "FAIL spark jars: SparkJarsError: " in check.stdout, check.stdout
    assert named in check.stdout, check.stdout + check.stderr[-3000:]
