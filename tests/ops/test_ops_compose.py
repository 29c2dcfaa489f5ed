"""docker-compose.yml, checked offline: Debian's docker-compose validates it (`config -q`, no daemon),
and its parts fit together: the services the demo promises, images pinned, mounts present, the sink
configuration valid for icesink, start-up order by health, the sink hardened as on Kubernetes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops_helpers import REPO

from service.config import load_config, render_identifier

COMPOSE = REPO / "docker-compose.yml"


def docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not installed: `apt-get install docker-compose` (Debian's package validates "
            "compose files without a Docker daemon; scripts/bootstrap installs it)",
            pytrace=False,
        )
    return exe


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The compose file as docker-compose resolves it (anchors merged, variables substituted)."""
    res = subprocess.run(
        [docker_compose(), "--project-directory", str(REPO), "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = yaml.safe_load(res.stdout)
    return data


def test_docker_compose_config_validates() -> None:
    res = subprocess.run(
        [docker_compose(), "--project-directory", str(REPO), "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert res.returncode == 0, f"docker-compose config -q failed:\n{res.stderr}"
    assert res.stderr.strip() == "", f"warnings from docker-compose:\n{res.stderr}"


def test_the_demo_has_every_part(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert set(services) == {
        "kafka",
        "postgres",
        "minio",
        "minio-init",
        "iceberg-rest",
        "producer",
        "icesink",
        "query",
        "registry",
    }
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
    assert services["iceberg-rest"]["image"].startswith("apache/iceberg-rest-fixture:")
    rest_env = services["iceberg-rest"]["environment"]
    assert rest_env["CATALOG_IO__IMPL"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert rest_env["CATALOG_S3_ENDPOINT"] == "http://minio:9000"
    for name, svc in services.items():
        image = svc.get("image", "")
        assert image and not image.endswith(":latest") and ":" in image, f"{name}: pin the image ({image!r})"
    # the icesink image serves the sink, the producer and the bucket set-up; query is its DuckDB target
    for name in ("icesink", "producer", "minio-init"):
        assert services[name]["image"] == "icesink:dev"
        assert services[name]["build"]["target"] == "runtime"
        assert Path(services[name]["build"]["context"]).resolve() == REPO
    assert services["query"]["build"]["target"] == "query"
    assert "service.sample" in " ".join(services["producer"]["command"])
    # JSON by default, Avro through the registry with ICESINK_DEMO_FORMAT=avro, producer and sink alike
    assert services["registry"]["image"].startswith("apicurio/apicurio-registry:")
    assert (
        "--format json --registry http://registry:8080/apis/ccompat/v7" in services["producer"]["command"][0]
    )
    assert services["icesink"]["environment"]["ICESINK_SOURCE__FORMAT"] == "debezium-json"


def test_start_up_order_waits_for_health(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    deps = services["icesink"]["depends_on"]
    assert deps["kafka"]["condition"] == "service_healthy"
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["iceberg-rest"]["condition"] == "service_healthy"
    assert deps["minio-init"]["condition"] == "service_completed_successfully"
    for name in ("kafka", "postgres", "iceberg-rest"):
        assert "healthcheck" in services[name], f"{name} needs a healthcheck for the depends_on conditions"


def test_mounted_files_exist_and_the_sink_config_is_valid(
    resolved: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = resolved["services"]
    mounts: dict[str, str] = {}
    for svc in services.values():
        for volume in svc.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            target = volume["target"] if isinstance(volume, dict) else volume.split(":")[1]
            path = Path(source)
            assert path.is_absolute() and path.exists(), f"mounted {source} does not exist"
            assert REPO / "dev" / "compose" in path.parents, f"{source}: demo files live in dev/compose/"
            mounts[target] = source
    sink = services["icesink"]
    config_path = sink["command"][sink["command"].index("--config") + 1]
    assert config_path in mounts, "the sink's --config file must be mounted"
    env = {k: str(v) for k, v in sink["environment"].items()}
    config = load_config(mounts[config_path], env=env)
    assert config.txnlog.dsn.startswith("postgresql://icesink:") and "@postgres:5432/" in config.txnlog.dsn
    assert config.kafka.bootstrap_servers == "kafka:9092"
    assert config.catalog["uri"] == "http://iceberg-rest:8181"
    assert config.catalog["s3.endpoint"] == "http://minio:9000"
    assert config.catalog["s3.secret-access-key"] == env["AWS_SECRET_ACCESS_KEY"]
    assert config.spark.conf.get("spark.ui.showConsoleProgress") == "false"
    assert config.health.port == 8080 and config.metrics.prometheus_port == 9464
    # The producer's topics are the sink's, and the table the query looks at is one the sink writes.
    runs = services["producer"]["command"][0].split("python -m service.sample")[1:]
    produced = {run.split("--topic ")[1].split()[0]: run.split("--table ")[1].split()[0] for run in runs}
    assert len(produced) == 2 and all(config.kafka.reads(topic) for topic in produced)
    tables = {render_identifier(config.table.identifier, {"source.table": t}) for t in produced.values()}
    query = services["query"]["command"]
    query_tables = [query[i + 1] for i, arg in enumerate(query) if arg == "--table"]
    assert set(query_tables) == tables, "the query service watches every table the sink writes"
    assert set(config.tables) <= tables, "the overrides name tables the demo writes"
    assert config.table_settings("demo.customers").partition_by == ["country"]
    assert not config.kafka.reads(config.dead_letter_topic)
    avro = load_config(mounts[config_path], env={**env, "ICESINK_SOURCE__FORMAT": "debezium-avro"})
    assert avro.source.framed and avro.source.schema_registry is not None  # ICESINK_DEMO_FORMAT=avro
    secret = env["AWS_SECRET_ACCESS_KEY"]
    assert secret not in Path(mounts[config_path]).read_text(), "credentials stay out of the config file"


def test_the_sink_runs_hardened(resolved: dict[str, Any]) -> None:
    sink = resolved["services"]["icesink"]
    assert sink["read_only"] is True
    assert sink["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in sink["security_opt"]
    tmpfs = sink["tmpfs"] if isinstance(sink["tmpfs"], list) else [sink["tmpfs"]]
    assert any(t.startswith("/tmp") and "exec" in t.split(":", 1)[1].split(",") for t in tmpfs)
    for name, svc in resolved["services"].items():
        for port in svc.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name}: publish demo ports on 127.0.0.1 only ({port})"
