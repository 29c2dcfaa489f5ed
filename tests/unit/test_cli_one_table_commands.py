"""Commands that work on one-table sinks refuse a sink of many tables with exit code 2 and one line
naming the command and the template, before they reach any server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.cli import EXIT_CONFIG, main

TEMPLATE_SINK = {
    "sink_id": "shop",
    "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic_pattern": r"shop\.public\..*"},
    "table": {"identifier": "lake.{source.table}"},
    "catalog": {"type": "rest", "uri": "http://127.0.0.1:1"},
    "txnlog": {"dsn": "postgresql+psycopg://u@127.0.0.1:1/icesink"},
}


@pytest.mark.parametrize("command", [["txnlog", "reseed"], ["orphans"]])
def test_one_table_commands_refuse_a_template_sink(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sink.yaml"
    config.write_text(yaml.safe_dump(TEMPLATE_SINK))
    assert main([*command, "--config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"icesink {' '.join(command)} works on a sink of one table" in err
    assert "'lake.{source.table}' is a template" in err
