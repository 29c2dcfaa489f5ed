"""The documentation's examples are what icesink and the tests accept.

Every YAML example in docs/*.md and README.md parses; every one that is a sink's configuration (it
has a ``sink_id``) or a Helm release's values (a ``config`` with one) is a valid configuration, with
the sections an excerpt leaves out filled in; every Debezium connector registered in docs/debezium.md
and docs/avro.md is the configuration ``tests.cdc.CdcSource.connector_config`` registers for its tables, and the sink
of a whole database reads each of its connector's topics and overrides only tables it writes.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import SinkConfig, parse_config, render_identifier
from tests.cdc import CdcSource

REPO = Path(__file__).resolve().parents[2]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
HEREDOC = re.compile(r"<<'EOF'\n(?P<body>.*?)^EOF$", re.M | re.S)
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
# The source database of the dev stack, as the connectors in docs/debezium.md reach it.
CDC_DSN = "postgresql+psycopg://icesink:icesink@127.0.0.1:15432/cdc"


def examples(lang: str) -> Iterator[tuple[str, str]]:
    """(where, text) of every fenced block of `lang`, dedented when it sits in a list item."""
    for doc in DOCS:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            if match.group("lang") == lang:
                line = text.count("\n", 0, match.start()) + 1
                yield f"{doc.relative_to(REPO)}:{line}", textwrap.dedent(match.group("body"))


YAML_EXAMPLES = list(examples("yaml"))


def as_sink_config(raw: Any) -> dict[str, Any] | None:
    """The sink configuration an example holds: itself, or a Helm release's ``config``."""
    if not isinstance(raw, dict):
        return None
    if "sink_id" in raw:
        return raw
    config = raw.get("config")
    if isinstance(config, dict) and "sink_id" in config and "credentials" in raw:
        return config
    return None


def parse_example(raw: dict[str, Any]) -> SinkConfig:
    """Parse a sink configuration example; catalog and txnlog are filled in when an excerpt leaves
    them out ("plus the catalog and the transaction log"), ${VAR} references get placeholders."""
    filled = {
        "catalog": {"type": "rest", "uri": "http://catalog:8181"},
        "txnlog": {"dsn": "postgresql+psycopg://icesink@pg:5432/icesink"},
        **raw,
    }
    if "dsn" not in filled["txnlog"]:  # the chart and the demos pass it as ICESINK_TXNLOG__DSN
        filled["txnlog"] = {**filled["txnlog"], "dsn": "postgresql+psycopg://icesink@pg:5432/icesink"}
    names = set(ENV_REF.findall(json.dumps(filled)))
    env = {name: "postgresql+psycopg://u@h/db" if "DSN" in name else f"<{name}>" for name in names}
    return parse_config(filled, env=env)


def test_the_docs_have_examples() -> None:
    assert len(YAML_EXAMPLES) >= 8
    assert sum(as_sink_config(yaml.safe_load(text)) is not None for _, text in YAML_EXAMPLES) >= 5


@pytest.mark.parametrize(("where", "text"), YAML_EXAMPLES, ids=[w for w, _ in YAML_EXAMPLES])
def test_yaml_examples_parse(where: str, text: str) -> None:
    raw = yaml.safe_load(text)
    sink = as_sink_config(raw)
    if sink is not None:
        parse_example(sink)


def connectors() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for where, text in examples("bash"):
        if ("debezium.md" in where or "avro.md" in where) and "/connectors" in text:
            for match in HEREDOC.finditer(text):
                found.append((where, json.loads(match.group("body"))))
    return found


def test_connector_examples_are_what_the_tests_register() -> None:
    found = connectors()
    assert len(found) >= 2, "docs/debezium.md registers one connector for a table and one for a database"
    source = CdcSource(connect_uri="http://127.0.0.1:18083", dsn=CDC_DSN, kafka_bootstrap="127.0.0.1:19092")
    try:
        for where, body in found:
            tables = body["config"]["table.include.list"].split(",")
            registry = body["config"].get("value.converter.apicurio.registry.url")
            options = {"avro_registry": registry.replace("/registry/v2", "/ccompat/v7")} if registry else {}
            assert body["config"] == source.connector_config(body["name"], tables, **options), where
    finally:
        source.engine.dispose()


def test_the_whole_database_example_routes_every_topic() -> None:
    """docs/debezium.md's database connector and its sink: the pattern reads each table's topic and
    nothing else of the connector's, each topic lands in a table of its own, the overrides name
    tables the sink writes, and the keys come from the records (none configured)."""
    ((_, connector),) = [c for c in connectors() if "," in c[1]["config"]["table.include.list"]]
    prefix = connector["config"]["topic.prefix"]
    tables = connector["config"]["table.include.list"].split(",")
    sinks = [
        parse_example(raw)
        for where, text in YAML_EXAMPLES
        if "debezium.md" in where
        and (raw := as_sink_config(yaml.safe_load(text))) is not None
        and raw["kafka"].get("topic_pattern")
    ]
    assert len(sinks) == 1
    (config,) = sinks
    assert config.table.is_template and config.table.key == []
    landed = {}
    for table in tables:
        schema, name = table.split(".")
        topic = f"{prefix}.{schema}.{name}"
        assert config.kafka.reads(topic), topic
        values = {"topic": topic, "source.db": "cdc", "source.schema": schema, "source.table": name}
        landed[topic] = render_identifier(config.table.identifier, values)
    assert len(set(landed.values())) == len(tables), f"each topic in its own table: {landed}"
    assert set(config.tables) <= set(landed.values())
    assert not config.kafka.reads(f"__debezium-heartbeat.{prefix}")
    assert not config.kafka.reads(config.dead_letter_topic)
