"""The Helm chart, checked offline: scripts/check-chart (helm lint, helm template for every
deploy/helm/icesink/ci/*.yaml, kubeconform and kubernetes-validate against bundled schemas), then the
rendered manifests against what the sink needs: a valid sink.yaml, hardened pods, probes on the health
endpoints, credentials only from the Secret, RBAC and a token only in Spark-on-Kubernetes mode; and,
with maintenance enabled, a CronJob or a second Deployment running `icesink maintain` in a pod like the
sink's. Bad values must fail at install time (values.schema.json and the chart's own checks).

Never skipped: scripts/check-chart builds helm and kubeconform with `go install` when they are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops_helpers import REPO

from service.config import SinkConfig, load_config, parse_config
from service.maintenance.spark import catalog_conf

CHART = REPO / "deploy" / "helm" / "icesink"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
HELM = Path(os.environ.get("ICESINK_CACHE_DIR", REPO / ".cache")) / "bin" / "helm"


NAMESPACE = "icesink-ci"  # scripts/check-chart's


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("chart")
    res = subprocess.run(
        [str(REPO / "scripts" / "check-chart"), "--out", str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,  # the first run builds helm with `go install`
    )
    assert res.returncode == 0, f"scripts/check-chart failed:\n{res.stderr[-6000:]}"
    docs = {}
    for values in CI_VALUES:
        manifests = out / f"{values.stem}.yaml"
        docs[values.stem] = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a Deployment or a CronJob."""
    spec = workload["spec"]
    template: dict[str, Any] = (spec["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else spec)[
        "template"
    ]
    return template


def workload(docs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    """The one Deployment or CronJob whose pods are the given component (sink, maintenance)."""
    found = [
        d
        for d in by_kind(docs, kind)
        if pod_template(d)["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"expected one {kind} of component {component}, got {len(found)}"
    return found[0]


def component_of(doc: dict[str, Any]) -> str | None:
    """The component label of a manifest's own metadata (the maintainer's objects carry one)."""
    component: str | None = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")
    return component


def sink_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return workload(docs, "Deployment", "sink")


def values_of(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "ci" / f"{name}.yaml").read_text())
    return data


def cases() -> Iterator[str]:
    yield from (v.stem for v in CI_VALUES)


def test_ci_values_cover_the_options() -> None:
    names = {v.stem for v in CI_VALUES}
    assert {
        "minimal-values",
        "full-values",
        "spark-kubernetes-values",
        "bare-values",
        "multi-table-values",
        "maintenance-cronjob-values",
        "maintenance-deployment-values",
    } <= names


def test_a_multi_table_release_renders_its_routing(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """ci/multi-table-values.yaml: a topic pattern, a template identifier and per-table overrides
    reach the sink's configuration as icesink reads them."""
    sink_yaml = one(rendered["multi-table-values"], "ConfigMap")["data"]["sink.yaml"]
    config = parse_config(yaml.safe_load(sink_yaml), env={"ICESINK_TXNLOG__DSN": "postgresql://u@db/icesink"})
    assert config.kafka.topic_pattern == r"shop\.public\..*" and config.kafka.reads("shop.public.orders")
    assert config.table.is_template and config.commit.concurrency == 8
    orders, audit = config.table_settings("lake.orders"), config.table_settings("lake.audit_log")
    assert orders.partition_by == ["country"] and orders.mode.value == "upsert"
    assert audit.mode.value == "append" and audit.on_failure == "dead_letter"


@pytest.mark.parametrize("case", list(cases()))
def test_the_sink_config_is_valid_for_icesink(
    rendered: dict[str, list[dict[str, Any]]], case: str, tmp_path: Path
) -> None:
    docs = rendered[case]
    deployment = sink_deployment(docs)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config = config_file(one(docs, "ConfigMap"), container["args"], container_env(container), tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config.health.port == ports["health"]
    assert container["args"] == ["run", "--config", "/etc/icesink/sink.yaml"]
    values = values_of(case)
    if values.get("metrics", {}).get("prometheus", {}).get("enabled", True):
        assert config.metrics.prometheus_port == ports["metrics"]
    else:
        assert config.metrics.prometheus_port is None and "metrics" not in ports
    assert config.sink_id == values["config"]["sink_id"]
    assert config.spark.conf["spark.ui.showConsoleProgress"] == "false"
    if values.get("spark", {}).get("kubernetes", {}).get("enabled"):
        assert config.spark.master.startswith("k8s://")
        assert config.spark.conf["spark.kubernetes.driver.pod.name"] == "icesink-0"
        assert "executor-pod-template.yaml" in one(docs, "ConfigMap")["data"]
    else:
        assert config.spark.master.startswith("local")
    log_format = config.log.format
    opts = next(e["value"] for e in container["env"] if e["name"] == "SPARK_SUBMIT_OPTS")
    assert opts.endswith(f"/opt/icesink/conf/log4j2-{log_format}.properties")
    assert (REPO / "deploy" / "log4j2" / f"log4j2-{log_format}.properties").exists()


@pytest.mark.parametrize("case", list(cases()))
def test_the_pod_is_hardened(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    docs = rendered[case]
    deployment = sink_deployment(docs)
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    values = values_of(case)
    k8s_mode = bool(values.get("spark", {}).get("kubernetes", {}).get("enabled"))
    workload_identity = "iam.gke.io/gcp-service-account" in values.get("serviceAccount", {}).get(
        "annotations", {}
    )
    assert pod["automountServiceAccountToken"] is (k8s_mode or workload_identity)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    spark_local = next(e["value"] for e in container["env"] if e["name"] == "SPARK_LOCAL_DIRS")
    assert "emptyDir" in volumes[mounts[spark_local]]
    assert volumes[mounts["/etc/icesink"]]["configMap"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # credentials only by reference to the existing Secret
    secret = values_of(case)["credentials"]["existingSecret"]
    for item in container["env"]:
        if "valueFrom" in item and "secretKeyRef" in item["valueFrom"]:
            assert item["valueFrom"]["secretKeyRef"]["name"] == secret
    assert not by_kind(docs, "Secret"), "the chart never creates Secrets"
    for item in container["env"]:
        if "value" in item:
            assert not any(w in item["name"] for w in ("PASSWORD", "SECRET", "DSN", "TOKEN")), item


@pytest.mark.parametrize("case", list(cases()))
def test_selectors_match_the_sink_pod(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    """Each selector picks the pods it is meant for: the sink's, or the maintainer's (its own
    Deployment, Service and NetworkPolicy), never both."""
    docs = rendered[case]
    pods = {
        labels["app.kubernetes.io/component"]: labels
        for kind in ("Deployment", "CronJob")
        for labels in (pod_template(w)["metadata"]["labels"] for w in by_kind(docs, kind))
    }

    def selected(selector: dict[str, str]) -> list[str]:
        return [name for name, labels in pods.items() if all(labels.get(k) == v for k, v in selector.items())]

    for deployment in by_kind(docs, "Deployment"):
        component = pod_template(deployment)["metadata"]["labels"]["app.kubernetes.io/component"]
        assert selected(deployment["spec"]["selector"]["matchLabels"]) == [component]
    for kind in ("Deployment", "CronJob"):  # `kubectl get deployment -l ...component=sink` (k8s-chaos.sh)
        for workload_ in by_kind(docs, kind):
            assert component_of(workload_) == component_of(pod_template(workload_)), workload_["metadata"]
    chaos = (REPO / "scripts" / "k8s-chaos.sh").read_text()
    assert 'selector="app.kubernetes.io/instance=$release,app.kubernetes.io/component=sink"' in chaos
    services = by_kind(docs, "Service")
    assert [selected(s["spec"]["selector"]) for s in services if component_of(s) is None] == [["sink"]]
    for service in services:  # the sink's, and the maintainer's (metrics only) in Deployment mode
        assert len(selected(service["spec"]["selector"])) == 1
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert selected(pdb["spec"]["selector"]["matchLabels"]) == ["sink"]
    policies = by_kind(docs, "NetworkPolicy")
    for policy in policies:
        assert len(selected(policy["spec"]["podSelector"]["matchLabels"])) == 1
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        dns = policy["spec"]["egress"][0]["ports"]
        assert {(p["port"], p["protocol"]) for p in dns} == {(53, "UDP"), (53, "TCP")}
    if policies:  # every pod of the release is under a policy of its own
        covered = [name for p in policies for name in selected(p["spec"]["podSelector"]["matchLabels"])]
        assert sorted(covered) == sorted(pods)
    for monitor in by_kind(docs, "ServiceMonitor"):
        scraped = [s for s in services if monitors(monitor, s)]
        # the sink's metrics and the maintainer's; not the Spark driver's Service (no metrics port)
        assert [s for s in services if s not in scraped] == [
            s for s in services if component_of(s) == "spark-driver"
        ]
        for service in scraped:
            port_names = {p["name"] for p in service["spec"]["ports"]}
            assert all(e["port"] in port_names for e in monitor["spec"]["endpoints"])
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"


def monitors(monitor: dict[str, Any], service: dict[str, Any]) -> bool:
    """Whether a ServiceMonitor's label selector (matchLabels, NotIn expressions) picks a Service."""
    labels = service["metadata"]["labels"]
    selector = monitor["spec"]["selector"]
    if not all(labels.get(k) == v for k, v in selector["matchLabels"].items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "NotIn", expression
        if labels.get(expression["key"]) in expression["values"]:
            return False
    return True


def test_optional_parts_follow_the_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    full, bare, k8s, minimal = (
        rendered["full-values"],
        rendered["bare-values"],
        rendered["spark-kubernetes-values"],
        rendered["minimal-values"],
    )
    assert by_kind(full, "ServiceMonitor") and not by_kind(minimal, "ServiceMonitor")
    assert not by_kind(bare, "NetworkPolicy") and not by_kind(bare, "PodDisruptionBudget")
    assert not by_kind(bare, "ServiceAccount")
    assert sink_deployment(bare)["spec"]["template"]["spec"]["serviceAccountName"] == "icesink-runner"
    assert sink_deployment(full)["spec"]["strategy"] == {"type": "Recreate"}
    assert sink_deployment(minimal)["spec"]["strategy"]["type"] == "RollingUpdate"
    # maintenance only when enabled
    for docs in (full, bare, k8s, minimal):
        assert not by_kind(docs, "CronJob") and len(by_kind(docs, "Deployment")) == 1
        assert "maintain.yaml" not in one(docs, "ConfigMap")["data"]
    assert one(full, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert one(minimal, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    # locked-down egress lists the destinations; the default allows any egress
    assert {} in one(minimal, "NetworkPolicy")["spec"]["egress"]
    assert {} not in one(full, "NetworkPolicy")["spec"]["egress"]
    # RBAC and a token only for Spark-on-Kubernetes
    for docs in (full, bare, minimal):
        assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    role, binding = one(k8s, "Role"), one(k8s, "RoleBinding")
    pod_rule = next(r for r in role["rules"] if "pods" in r["resources"])
    assert {"create", "delete", "list", "watch"} <= set(pod_rule["verbs"])
    sa = one(k8s, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is True
    assert one(minimal, "ServiceAccount")["automountServiceAccountToken"] is False
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    policy = one(k8s, "NetworkPolicy")["spec"]
    driver_ports = {p["port"] for rule in policy["ingress"] for p in rule.get("ports", []) if "from" in rule}
    assert {7078, 7079} <= driver_ports
    api = [r for r in policy["egress"] if any("ipBlock" in t for t in r.get("to", []))]
    assert api and api[0]["ports"] == [{"port": 443, "protocol": "TCP"}]
    template = yaml.safe_load(one(k8s, "ConfigMap")["data"]["executor-pod-template.yaml"])
    assert template["spec"]["automountServiceAccountToken"] is False
    (executor,) = template["spec"]["containers"]
    assert executor["command"] == ["/opt/icesink/bin/spark-executor"]
    assert "/opt/icesink/bin/spark-executor" in (REPO / "Dockerfile").read_text()
    assert executor["securityContext"]["readOnlyRootFilesystem"] is True


def test_kubernetes_executors_get_what_the_standalone_cluster_needed(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The executor pods get what the sink's executors needed on the stack's standalone cluster
    (tests/sink/test_cluster.py: the driver's address, the same Python as the driver, Spark's jars)
    and nothing of the sink's own: no credential, no token, no configuration file (the tasks carry
    what they need). They call the driver by its headless Service's name, which stands for one pod
    (Recreate: an executor must reach the driver that started it, never a rolling update's other
    pod). RBAC covers only pods and their ConfigMap, PVCs only when asked for."""
    docs = rendered["spark-kubernetes-values"]
    deployment = sink_deployment(docs)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = container_env(container)
    config = config_file(one(docs, "ConfigMap"), container["args"], env, tmp_path)
    conf = config.spark.conf
    (driver,) = [s for s in by_kind(docs, "Service") if component_of(s) == "spark-driver"]
    assert conf["spark.driver.host"] == f"{driver['metadata']['name']}.{NAMESPACE}.svc"
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert driver["spec"]["clusterIP"] == "None" and driver["spec"]["publishNotReadyAddresses"] is True
    assert driver["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"]: p["port"] for p in driver["spec"]["ports"]} == {
        "spark-driver": ports["spark-driver"],
        "spark-blocks": ports["spark-blocks"],
    }
    assert {conf["spark.driver.port"], conf["spark.driver.blockManager.port"]} == {
        str(ports["spark-driver"]),
        str(ports["spark-blocks"]),
    }
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    executor_values = values_of("spark-kubernetes-values")["spark"]["kubernetes"]["executor"]
    assert conf["spark.executor.memory"] == executor_values["memory"]
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"
    # The same interpreter on both sides: PySpark gives the executors the driver's (the image's).
    dockerfile = (REPO / "Dockerfile").read_text()
    python = "/opt/icesink/venv/bin/python"
    assert f"PYSPARK_PYTHON={python}" in dockerfile
    launcher = (REPO / "deploy" / "docker" / "spark-executor.sh").read_text()
    assert f"python=${{PYSPARK_PYTHON:-{python}}}" in launcher
    assert 'classpath="${SPARK_CONF_DIR:-$spark_home/conf}:$spark_home/jars/*"' in launcher
    # Nothing of the sink's own: no variable from its Secret, no mounted file, no token.
    template = yaml.safe_load(one(docs, "ConfigMap")["data"]["executor-pod-template.yaml"])
    (executor,) = template["spec"]["containers"]
    assert "env" not in executor and "envFrom" not in executor
    assert [m["mountPath"] for m in executor["volumeMounts"]] == ["/tmp"]
    assert [v["name"] for v in template["spec"]["volumes"]] == ["tmp"]
    assert template["spec"]["automountServiceAccountToken"] is False
    assert executor["securityContext"] == container["securityContext"]
    role = one(docs, "Role")
    assert sorted(r for rule in role["rules"] for r in rule["resources"]) == ["configmaps", "pods"]


MAINTENANCE_CASES = {"maintenance-cronjob-values": "cronjob", "maintenance-deployment-values": "deployment"}


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The variables a container sees, with placeholders for the Secret's keys and the pod's fields."""
    env: dict[str, str] = {"POD_NAME": "icesink-0", "POD_IP": "10.1.2.3", "POD_NAMESPACE": "ns"}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            env[item["name"]] = "postgresql://u@db/icesink" if "DSN" in item["name"] else f"<{item['name']}>"
    return env


def config_file(
    config_map: dict[str, Any], args: list[str], env: dict[str, str], tmp_path: Path
) -> SinkConfig:
    """The configuration a container's `--config /etc/icesink/<key>` reads from the mounted ConfigMap."""
    path = args[args.index("--config") + 1]
    assert path.startswith("/etc/icesink/"), path
    file = tmp_path / path.removeprefix("/etc/icesink/")
    file.write_text(config_map["data"][file.name])
    return load_config(file, env=env)


@pytest.mark.parametrize(("case", "mode"), sorted(MAINTENANCE_CASES.items()))
def test_the_maintainer_runs_icesink_maintain_like_the_sink(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, case: str, mode: str
) -> None:
    """maintenance.enabled: a CronJob (`--once`) or a second Deployment (looping) runs `icesink maintain`
    for the same sink, in a pod with the sink's configuration, Secret references, volumes and hardening."""
    docs, values = rendered[case], values_of(case)
    kind = "CronJob" if mode == "cronjob" else "Deployment"
    maintainer, sink = workload(docs, kind, "maintenance"), sink_deployment(docs)
    pod, sink_pod = pod_template(maintainer)["spec"], pod_template(sink)["spec"]
    (container,) = pod["containers"]
    (sink_container,) = sink_pod["containers"]
    once = ["--once"] if mode == "cronjob" else []
    assert container["args"] == ["maintain", *once, "--config", "/etc/icesink/maintain.yaml"]
    assert container["image"] == sink_container["image"]
    # the sink's environment (credentials as references to the same Secret keys), envFrom and volumes
    assert container["env"] == sink_container["env"]
    assert container.get("envFrom") == sink_container.get("envFrom")
    assert container["volumeMounts"] == sink_container["volumeMounts"]
    assert pod["volumes"] == sink_pod["volumes"]
    secret = values["credentials"]["existingSecret"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {name: {"name": secret, "key": key} for name, key in values["credentials"]["env"].items()}
    for item in container["env"]:
        if "value" in item:
            assert not any(w in item["name"] for w in ("PASSWORD", "SECRET", "DSN", "TOKEN", "KEY")), item
    # the same hardening and identity, without the service account token (local-mode Spark)
    assert container["securityContext"] == sink_container["securityContext"]
    for key in ("securityContext", "serviceAccountName", "enableServiceLinks"):
        assert pod[key] == sink_pod[key], key
    assert pod["automountServiceAccountToken"] is False
    assert "livenessProbe" not in container and "readinessProbe" not in container  # no health endpoint
    assert container["resources"] == values["maintenance"]["resources"]
    # maintain.yaml: the sink's configuration, Spark in local mode with the maintainer's driver memory
    config_map = one(docs, "ConfigMap")
    env = container_env(container)
    config = config_file(config_map, container["args"], env, tmp_path)
    sink_config = config_file(config_map, sink_container["args"], env, tmp_path)
    for section in ("sink_id", "kafka", "table", "tables", "catalog", "txnlog", "maintenance", "log"):
        assert getattr(config, section) == getattr(sink_config, section), section
    assert config.spark.master == values["maintenance"]["spark"]["master"]
    assert config.spark.conf["spark.driver.memory"] == values["maintenance"]["spark"]["driverMemory"]
    assert not any(
        k.startswith(("spark.kubernetes.", "spark.executor.", "spark.driver.host")) for k in config.spark.conf
    )
    assert config.spark.conf["spark.local.dir"] == next(
        e["value"] for e in container["env"] if e["name"] == "SPARK_LOCAL_DIRS"
    )
    catalog_conf(config)  # the catalog maps to a Spark Iceberg catalog (else `icesink maintain` exits 2)
    for key, value in values["config"].get("maintenance", {}).get("spark_catalog", {}).items():
        assert catalog_conf(config)[f"spark.sql.catalog.icesink.{key}"] == value
    assert pod_template(maintainer)["metadata"]["annotations"]["checksum/config"]
    policies = {
        p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p["spec"]
        for p in by_kind(docs, "NetworkPolicy")
    }
    policy, sink_policy = policies["maintenance"], policies["sink"]
    if not values.get("spark", {}).get("kubernetes", {}).get("enabled"):
        assert policy["egress"] == sink_policy["egress"]
    metrics_port = {p["name"]: p["containerPort"] for p in container.get("ports", [])}.get("metrics")
    if mode == "cronjob":
        cron = maintainer["spec"]
        assert cron["concurrencyPolicy"] == "Forbid"
        assert cron["schedule"] == values["maintenance"]["schedule"]
        assert cron.get("timeZone") == values["maintenance"].get("timeZone")
        job = cron["jobTemplate"]["spec"]
        assert job["backoffLimit"] == 0
        assert job["activeDeadlineSeconds"] == values["maintenance"].get("activeDeadlineSeconds", 3600)
        fail_job = next(r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
        assert fail_job["onExitCodes"] == {"containerName": "maintain", "operator": "In", "values": [2, 3]}
        assert pod["restartPolicy"] == "Never"
        # nobody scrapes a Job's pod: no Prometheus endpoint, metrics by OTLP, no ingress at all
        assert config.metrics.prometheus_port is None and metrics_port is None
        assert config.metrics.otlp_endpoint == values["metrics"]["otlp"]["endpoint"]
        assert policy["ingress"] == []
        assert not [d for d in by_kind(docs, "Service") if component_of(d) == "maintenance"]
    else:
        spec = maintainer["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
        assert config.metrics.prometheus_port == metrics_port == sink_config.metrics.prometheus_port
        service = next(d for d in by_kind(docs, "Service") if component_of(d) == "maintenance")
        assert service["spec"]["ports"] == [
            {"name": "metrics", "port": metrics_port, "targetPort": "metrics", "protocol": "TCP"}
        ]
        assert [p["port"] for rule in policy["ingress"] for p in rule["ports"]] == ["metrics"]
        # beside a Spark-on-Kubernetes sink: the sink is the driver, the maintainer is not
        assert sink_config.spark.master.startswith("k8s://") and config.spark.master.startswith("local")


BASE = {
    "image": {"repository": "icesink", "tag": "x"},
    "config": {
        "sink_id": "s",
        "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "table": {"identifier": "a.b", "key": ["id"]},
        "catalog": {"type": "rest", "uri": "http://c"},
    },
    "credentials": {"existingSecret": "s"},
}


def merged(patch: dict[str, Any]) -> dict[str, Any]:
    """BASE with `patch` applied; None removes a key."""

    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return out

    return merge(BASE, patch)


def helm_template(values: dict[str, Any], workdir: Path) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), "scripts/check-chart builds helm; it runs in the `rendered` fixture"
    file = workdir / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    return subprocess.run(
        [str(HELM), "template", "x", str(CHART), "-f", str(file), "--kube-version", "1.34.0"],
        capture_output=True,
        text=True,
        env={**os.environ, "HELM_CONFIG_HOME": str(workdir), "HELM_CACHE_HOME": str(workdir)},
        timeout=120,
    )


def test_the_smallest_values_render(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    res = helm_template(BASE, tmp_path)
    assert res.returncode == 0, res.stderr


def test_a_template_sink_needs_no_key(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Upsert mode needs table.key for one table only: a template's tables take their record keys'
    (or a key of their own under tables); the sink.yaml carries the pattern and no empty topics."""
    patch = {
        "config": {
            "kafka": {"topics": None, "topic_pattern": r"shop\.public\..*"},
            "table": {"identifier": "lake.{source.schema}_{source.table}", "key": None},
            "tables": {"lake.public_orders": {"key": ["order_id"]}},
            "source": {"variable_scale_decimal": "decimal(38,10)"},
        }
    }
    res = helm_template(merged(patch), tmp_path)
    assert res.returncode == 0, res.stderr
    config_map = next(d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "ConfigMap")
    sink = yaml.safe_load(config_map["data"]["sink.yaml"])
    assert "topics" not in sink["kafka"] and "key" not in sink["table"]
    config = parse_config(sink, env={"ICESINK_TXNLOG__DSN": "postgresql://u@db/x"})
    assert config.kafka.topic_pattern == r"shop\.public\..*" and config.table.is_template
    assert config.table_settings("lake.public_orders").key == ["order_id"]
    assert config.table_settings("lake.public_customers").key == []  # from the record keys


@pytest.mark.parametrize(
    ("why", "patch", "message"),
    [
        ("no Secret named", {"credentials": {"existingSecret": ""}}, "existingSecret"),
        ("password in the DSN", {"config": {"txnlog": {"dsn": "postgresql://u:hunter2@db/x"}}}, "txnlog"),
        ("literal S3 secret", {"config": {"catalog": {"s3.secret-access-key": "abc"}}}, "secret-access-key"),
        (
            "literal Kafka password",
            {"config": {"kafka": {"options": {"sasl.password": "p"}}}},
            "sasl.password",
        ),
        ("unknown top-level key", {"replicaCount": 3}, "replicaCount"),
        ("chart-owned config key", {"config": {"health": {"port": 1}}}, "health"),
        ("no topics", {"config": {"kafka": {"topics": []}}}, "topics"),
        ("a bad override", {"config": {"tables": {"a.b": {"colour": "red"}}}}, "colour"),
        (
            "topics and a pattern",
            {"config": {"kafka": {"topic_pattern": "t.*"}}},
            "set one of topics (a list of topics) and topic_pattern (a regex), not both",
        ),
        ("neither topics nor a pattern", {"config": {"kafka": {"topics": None}}}, "topic_pattern"),
        ("an empty pattern", {"config": {"kafka": {"topics": None, "topic_pattern": ""}}}, "topic_pattern"),
        (
            "a template field icesink does not know",
            {"config": {"table": {"identifier": "lake.{source.name}"}}},
            "identifier",
        ),
        (
            "a template that is no namespace.table",
            {"config": {"table": {"identifier": "{topic}"}}},
            "identifier",
        ),
        (
            "an override of another table than the fixed one",
            {"config": {"tables": {"a.other": {"mode": "append"}}}},
            "config.tables.a.other: the sink writes only a.b",
        ),
        (
            "an override keyed by a template",
            {"config": {"table": {"identifier": "a.{source.table}"}, "tables": {"a.{source.table}": {}}}},
            "invalid propertyName 'a.{source.table}'",
        ),
        ("commit concurrency 0", {"config": {"commit": {"concurrency": 0}}}, "concurrency"),
        ("upsert without key", {"config": {"table": {"identifier": "a.b", "key": []}}}, "key"),
        ("bad table identifier", {"config": {"table": {"identifier": "nodot"}}}, "identifier"),
        ("non-local master", {"spark": {"master": "yarn"}}, "master"),
        ("bad log format", {"config": {"log": {"format": "xml"}}}, "format"),
        (
            "a rolling update of a driver that executors call by name",
            {"spark": {"kubernetes": {"enabled": True}}, "updateStrategy": {"type": "RollingUpdate"}},
            "updateStrategy.type RollingUpdate with spark.kubernetes.enabled",
        ),
        ("root user", {"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
        ("spark scratch in /tmp", {"scratch": {"sparkLocal": {"path": "/tmp/spark"}}}, "path"),
        (
            "a maintenance mode the chart lacks",
            {"maintenance": {"enabled": True, "mode": "daemonset"}},
            "mode",
        ),
        (
            "a schedule that is no cron expression",
            {"maintenance": {"enabled": True, "schedule": "hourly"}},
            "schedule",
        ),
        (
            "a time zone inside the schedule",
            {"maintenance": {"enabled": True, "schedule": "CRON_TZ=UTC 0 * * * *"}},
            "schedule",
        ),
        (
            "a maintainer's Spark off the pod",
            {"maintenance": {"spark": {"master": "k8s://https://k:443"}}},
            "master",
        ),
        ("maintenance resources of another shape", {"maintenance": {"resources": {"cpu": "1"}}}, "cpu"),
        (
            "a literal secret in the maintainer's Spark catalog",
            {"config": {"maintenance": {"spark_catalog": {"s3.secret-access-key": "abc"}}}},
            "secret-access-key",
        ),
        (
            "an unknown maintenance setting",
            {"config": {"maintenance": {"compaction": {"threshold": 3}}}},
            "threshold",
        ),
        (
            "a catalog Spark's Iceberg catalogs don't know, undescribed",
            {
                # a catalog class of one's own, as pyiceberg loads it (py-catalog-impl)
                "config": {"catalog": {"type": "acme", "py-catalog-impl": "acme.iceberg.AcmeCatalog"}},
                "maintenance": {"enabled": True},
            },
            "maintenance: the catalog type acme has no Spark equivalent icesink knows",
        ),
    ],
)
def test_bad_values_fail_at_install_time(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, why: str, patch: dict[str, Any], message: str
) -> None:
    res = helm_template(merged(patch), tmp_path)
    assert res.returncode != 0, f"{why}: helm template accepted {patch}"
    assert message in res.stderr, f"{why}: the error should name {message!r}:\n{res.stderr}"


def test_maintenance_options_render(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """A catalog described to Spark in config.maintenance.spark_catalog (its secret a ${VAR} reference),
    durations in days, and a looping maintainer without a Prometheus endpoint: no metrics port, Service
    or ingress."""
    patch = {
        "config": {
            "catalog": {"type": "sql", "uri": "${CATALOG_URI}"},
            "maintenance": {
                "interval": "15m",
                "expiry": {"older_than": "2d"},
                "spark_catalog": {
                    "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                    "uri": "jdbc:postgresql://db/catalog",
                    "jdbc.password": "${CATALOG_PASSWORD}",
                },
            },
        },
        "credentials": {"env": {"CATALOG_URI": "catalog-uri", "CATALOG_PASSWORD": "catalog-password"}},
        "maintenance": {"enabled": True, "mode": "deployment"},
        "metrics": {"prometheus": {"enabled": False}},
    }
    res = helm_template(merged(patch), tmp_path)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    maintainer = workload(docs, "Deployment", "maintenance")
    (container,) = pod_template(maintainer)["spec"]["containers"]
    assert "ports" not in container
    assert [component_of(d) for d in by_kind(docs, "Service")] == [None]  # the sink's only
    policy = next(p for p in by_kind(docs, "NetworkPolicy") if component_of(p) == "maintenance")
    assert policy["spec"]["ingress"] == []
    env = {**container_env(container), "CATALOG_PASSWORD": "pw"}
    config = config_file(one(docs, "ConfigMap"), container["args"], env, tmp_path)
    assert config.maintenance.interval.total_seconds() == 900 and config.metrics.prometheus_port is None
    assert config.maintenance.expiry.older_than.total_seconds() == 2 * 86400
    spark = catalog_conf(config)
    assert spark["spark.sql.catalog.icesink.catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert spark["spark.sql.catalog.icesink.jdbc.password"] == "pw"  # from the Secret, at run time
    assert "jdbc.password: ${CATALOG_PASSWORD}" in one(docs, "ConfigMap")["data"]["maintain.yaml"]


def test_gke_workload_identity_gives_every_pod_its_token(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """A ServiceAccount bound to a Google service account (iam.gke.io/gcp-service-account): GKE's metadata
    server gives a pod Google credentials only when the pod carries its Kubernetes token, so the sink,
    the maintainer and the executors (which write data files) all run as that account with its token;
    no key and no token reach the configuration."""
    docs = rendered["gke-workload-identity-values"]
    account = one(docs, "ServiceAccount")
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com"
    )
    name = account["metadata"]["name"]
    executor = yaml.safe_load(one(docs, "ConfigMap")["data"]["executor-pod-template.yaml"])["spec"]
    for what, pod in [
        ("sink", pod_template(sink_deployment(docs))["spec"]),
        ("maintainer", pod_template(workload(docs, "CronJob", "maintenance"))["spec"]),
        ("executors", executor),
    ]:
        assert pod["serviceAccountName"] == name, what
        assert pod["automountServiceAccountToken"] is True, what
    sink = yaml.safe_load(one(docs, "ConfigMap")["data"]["sink.yaml"])
    assert sink["catalog"]["warehouse"].startswith("gs://")
    assert not [k for k in sink["catalog"] if k.startswith("gcs.oauth2")]
    (container,) = pod_template(sink_deployment(docs))["spec"]["containers"]
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in container_env(container)


def test_a_token_for_no_pod_that_does_not_need_one(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """serviceAccount.automountToken: false keeps the token out of the maintainer's and the executors'
    pods even with a workload identity annotation; the sink's pod keeps it in Spark-on-Kubernetes mode,
    where it manages its executors."""
    values = values_of("gke-workload-identity-values")
    values["serviceAccount"]["automountToken"] = False
    res = helm_template(values, tmp_path)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    executor = yaml.safe_load(one(docs, "ConfigMap")["data"]["executor-pod-template.yaml"])["spec"]
    assert executor["automountServiceAccountToken"] is False and "serviceAccountName" not in executor
    assert (
        pod_template(workload(docs, "CronJob", "maintenance"))["spec"]["automountServiceAccountToken"]
        is False
    )
    assert pod_template(sink_deployment(docs))["spec"]["automountServiceAccountToken"] is True


def test_executor_volumes_claimed_on_demand_get_their_rights(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """spark.kubernetes.persistentVolumeClaims: the Role grants claims and the driver may own them."""
    values = values_of("spark-kubernetes-values")
    values["spark"]["kubernetes"]["persistentVolumeClaims"] = True
    res = helm_template(values, tmp_path)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    role = one(docs, "Role")
    assert sorted(r for rule in role["rules"] for r in rule["resources"]) == [
        "configmaps",
        "persistentvolumeclaims",
        "pods",
    ]
    (container,) = sink_deployment(docs)["spec"]["template"]["spec"]["containers"]
    config = config_file(one(docs, "ConfigMap"), container["args"], container_env(container), tmp_path)
    assert "spark.kubernetes.driver.ownPersistentVolumeClaim" not in config.spark.conf
