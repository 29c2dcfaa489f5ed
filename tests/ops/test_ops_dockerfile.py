"""The Dockerfile, checked without a Docker engine: what it copies exists and is in the build context,
the jars it bakes in are the ones `icesink run` and `icesink maintain` need (and their download step
works), the runtime is hardened (non-root, health check, no secrets)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ops_helpers import REPO

from service.config import SparkConfig
from service.spark_jars import (
    JARS_ENV,
    TOKEN_PROVIDER_VERSION,
    check_files,
    iceberg_coordinates,
    kafka_source_coordinates,
    resolve,
)

DOCKERFILE = REPO / "Dockerfile"
JAR_LIST = REPO / "deploy" / "docker" / "spark-jars.txt"
FETCH = REPO / "deploy" / "docker" / "fetch-jars.sh"
DEV_POM = REPO / "dev" / "maven" / "spark" / "pom.xml"
JAR_DIR = "/opt/icesink/jars"


@dataclass
class Instruction:
    keyword: str
    args: str
    stage: str


@dataclass
class Dockerfile:
    instructions: list[Instruction] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)

    def stage(self, name: str) -> list[Instruction]:
        return [i for i in self.instructions if i.stage == name]

    def of(self, keyword: str, stage: str | None = None) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword and (stage is None or i.stage == stage)]


def parse_dockerfile(text: str) -> Dockerfile:
    out = Dockerfile()
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue  # comments (also inside continuations) and blank lines
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, "the Dockerfile ends inside a line continuation"
    stage = ""
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            stage = words[2] if len(words) >= 3 and words[1].upper() == "AS" else f"#{len(out.stages)}"
            out.stages.append(stage)
        out.instructions.append(Instruction(keyword, args.strip(), stage))
    return out


def copy_parts(args: str) -> tuple[dict[str, str], list[str], str]:
    """(flags, sources, destination) of a COPY/ADD in shell or JSON form."""
    words = json.loads(args) if args.startswith("[") else shlex.split(args)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, val = words.pop(0)[2:].partition("=")
        flags[key] = val
    return flags, words[:-1], words[-1]


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = pattern.strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((negate, re.compile(regex + r"\Z")))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: a pattern matching a path or any of its parent directories applies; the last
    applicable pattern decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            included = negate
    return included


def tracked_files(*paths: str) -> list[str]:
    res = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in res.stdout.splitlines() if (REPO / f).is_file()]


def jar_list() -> list[tuple[str, str, str, str]]:
    entries = []
    for line in JAR_LIST.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            coord, sha = line.split()
            group, artifact, version = coord.split(":")
            entries.append((group, artifact, version, sha))
    return entries


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_every_copied_file_exists_and_is_in_the_build_context(dockerfile: Dockerfile) -> None:
    rules = dockerignore_rules()
    copies = dockerfile.of("COPY") + dockerfile.of("ADD")
    assert copies
    for ins in copies:
        flags, sources, _dest = copy_parts(ins.args)
        if "from" in flags:
            assert flags["from"] in dockerfile.stages[: dockerfile.stages.index(ins.stage)], (
                f"COPY --from={flags['from']} in stage {ins.stage} names no earlier stage"
            )
            continue
        for source in sources:
            assert not re.match(r"[a-z]+://", source), f"{ins.keyword} of a URL: {source}"
            matches = sorted(REPO.glob(source))
            assert matches, f"{ins.keyword} {source} (stage {ins.stage}): no such file in the repository"
            for match in matches:
                files = [match] if match.is_file() else [p for p in match.rglob("*") if p.is_file()]
                for f in files:
                    rel = f.relative_to(REPO).as_posix()
                    if "__pycache__" in rel:
                        continue
                    assert in_context(rel, rules), f"{rel} is copied but excluded by .dockerignore"


def test_the_wheel_build_has_every_package_file(dockerfile: Dockerfile) -> None:
    """The build stage copies pyproject.toml, its readme and the packages setuptools will look for."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {
        src.rstrip("/")
        for ins in dockerfile.of("COPY", "build")
        for src in copy_parts(ins.args)[1]
        if "from" not in copy_parts(ins.args)[0]
    }
    assert "pyproject.toml" in copied and project["project"]["readme"] in copied
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert set(packages) <= copied, f"packages {packages} must all be copied into the build stage"
    rules = dockerignore_rules()
    for f in tracked_files(*packages):
        assert in_context(f, rules), f"{f} belongs to the wheel but is excluded by .dockerignore"
    for secretish in (".git/config", ".venv/bin/python", ".cache/run/logs/postgres.log", "tests/conftest.py"):
        assert not in_context(secretish, rules), f"{secretish} must not be in the build context"


def test_the_jars_are_the_ones_the_job_needs(dockerfile: Dockerfile) -> None:
    entries = jar_list()
    coords = {(g, a, v) for g, a, v, _ in entries}
    # the same set as the dev stack's: the Kafka source and what it needs, Iceberg's Spark runtime and AWS bundle
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(DEV_POM).getroot()
    props = {el.tag.split("}")[1]: el.text for el in pom.find("m:properties", ns) or []}
    dev = set()
    for dep in pom.iterfind("m:dependencies/m:dependency", ns):
        g, a, v = (dep.findtext(f"m:{k}", namespaces=ns) or "" for k in ("groupId", "artifactId", "version"))
        v = re.sub(r"\$\{([^}]+)\}", lambda m: props[m.group(1)] or "", v)
        dev.add((g, a, v))
    assert coords == dev, (
        f"deploy/docker/spark-jars.txt {sorted(coords)} != dev/maven/spark/pom.xml {sorted(dev)}"
    )
    # the Kafka source must be built for exactly the pinned pyspark
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pyspark = next(d.split("==")[1] for d in deps if d.startswith("pyspark=="))
    assert ("org.apache.spark", "spark-sql-kafka-0-10_2.13", pyspark) in coords
    # the token provider the sink fetches when no jar files are named is the image's
    token_provider = kafka_source_coordinates()[1].split(":")
    assert (*token_provider, TOKEN_PROVIDER_VERSION) in coords
    # `icesink maintain` needs the Iceberg jars it would fetch by Maven coordinates without jar files
    for coordinate in iceberg_coordinates():
        assert tuple(coordinate.split(":")) in coords, f"{coordinate} is missing from {JAR_LIST.name}"
    # ICESINK_SPARK_JARS names exactly these files where the jars stage puts them
    env = " ".join(i.args for i in dockerfile.of("ENV", "runtime-base"))
    match = re.search(r"ICESINK_SPARK_JARS=(\S+)", env)
    assert match, "the runtime must set ICESINK_SPARK_JARS"
    assert sorted(match.group(1).split(",")) == sorted(f"{JAR_DIR}/{a}-{v}.jar" for _, a, v, _ in entries)
    fetch = " ".join(i.args for i in dockerfile.of("RUN", "jars"))
    assert "fetch-jars.sh" in fetch and JAR_DIR in fetch
    copies = [copy_parts(i.args) for i in dockerfile.of("COPY", "runtime-base")]
    assert any(f.get("from") == "jars" and JAR_DIR in s for f, s, _ in copies)
    # pins match the files the dev stack fetched (if present) -- both came from Maven Central
    for _g, a, v, sha in entries:
        local = REPO / ".cache" / "jars" / f"{a}-{v}.jar"
        if local.exists():
            assert hashlib.sha256(local.read_bytes()).hexdigest() == sha, f"{local.name}: SHA-256 pin differs"


def test_fetch_jars_downloads_and_verifies(tmp_path: Path) -> None:
    """The jars stage's script, run against the dev stack's local Maven repository (file://)."""
    m2 = Path(os.environ.get("ICESINK_CACHE_DIR") or REPO / ".cache") / "m2"  # where dev/stack put it
    assert (m2 / "org" / "apache" / "spark").is_dir(), "run `dev/stack install` first (it fills .cache/m2)"
    env = {"PATH": "/usr/bin:/bin", "MAVEN_REPO": m2.as_uri()}
    res = subprocess.run(
        ["sh", str(FETCH), str(JAR_LIST), str(tmp_path / "jars")], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp_path / "jars").iterdir()) == sorted(
        f"{a}-{v}.jar" for _, a, v, _ in jar_list()
    )
    # as the image names them in ICESINK_SPARK_JARS, they hold every class the sink and the maintainer load
    environ = {JARS_ENV: ",".join(str(p) for p in sorted((tmp_path / "jars").iterdir()))}
    for iceberg in (False, True):
        check_files(resolve(SparkConfig(), environ, iceberg=iceberg))
    tampered = tmp_path / "tampered.txt"
    g, a, v, _sha = jar_list()[0]
    tampered.write_text(f"{g}:{a}:{v} {'0' * 64}\n")
    res = subprocess.run(
        ["sh", str(FETCH), str(tampered), str(tmp_path / "bad")], env=env, capture_output=True, text=True
    )
    assert res.returncode != 0 and "SHA-256 mismatch" in res.stderr
    assert not list((tmp_path / "bad").glob("*.jar"))


def test_runtime_is_small_non_root_healthy_and_secret_free(dockerfile: Dockerfile) -> None:
    assert dockerfile.stages[-1] == "runtime", "the default (last) stage must be the runtime image"
    assert {"jars", "native", "build", "runtime-base", "query", "runtime"} <= set(dockerfile.stages)
    installed = " ".join(i.args for i in dockerfile.of("RUN", "build"))
    assert "/native/icesink_avrodec-" in installed, "the native Avro decoder must be in the image's venv"
    base_args = next(
        i.args for i in dockerfile.instructions if i.keyword == "ARG" and "PYTHON_IMAGE" in i.args
    )
    assert re.search(r"python:3\.11-slim", base_args)
    for ins in dockerfile.of("FROM"):
        assert ins.args.split()[0] in ("${PYTHON_IMAGE}", "runtime-base"), ins.args
    apt = " ".join(i.args for i in dockerfile.of("RUN", "runtime-base"))
    assert "openjdk-17-jre-headless" in apt and "--no-install-recommends" in apt
    assert "rm -rf /var/lib/apt/lists/*" in apt
    for stage in ("runtime-base", "query"):
        users = dockerfile.of("USER", stage)
        assert users, f"stage {stage} sets no USER"
        uid = users[-1].args.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, "run as a numeric non-root user (Kubernetes runAsNonRoot)"
    health = " ".join(i.args for i in dockerfile.of("HEALTHCHECK", "runtime-base"))
    assert "/healthz" in health and "CMD" in health
    entry = dockerfile.of("ENTRYPOINT", "runtime")
    assert entry and json.loads(entry[-1].args) == ["icesink"]
    for ins in dockerfile.of("ENV") + dockerfile.of("ARG"):
        for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", ins.args):
            assert not re.search(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL|DSN", name), (
                f"{ins.keyword} {name}: credentials are passed at run time, never baked into the image"
            )
    assert (
        "SPARK_SUBMIT_OPTS=-Dlog4j2.configurationFile=/opt/icesink/conf/log4j2-text.properties"
        in " ".join(i.args for i in dockerfile.of("ENV", "runtime-base"))
    )


def test_query_stage_pins_the_dev_duckdb(dockerfile: Dockerfile) -> None:
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    pins = {d for d in dev if d.startswith("duckdb")}
    run = " ".join(i.args for i in dockerfile.of("RUN", "query"))
    installed = set(re.findall(r"duckdb[a-z-]*==[0-9.]+", run))
    assert installed and installed <= pins, f"query stage installs {installed}, dev extras pin {pins}"


def test_spark_executor_launcher_builds_the_executor_command(tmp_path: Path) -> None:
    """What a Spark-on-Kubernetes executor pod runs (the chart's pod template sets it as the command)."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    java.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "JAVA_HOME": str(tmp_path / "jdk"),
        "SPARK_HOME": "/spark",
        "PYSPARK_PYTHON": "/opt/icesink/venv/bin/python",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.5:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_EXECUTOR_MEMORY": "4g",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_EXECUTOR_POD_NAME": "icesink-exec-3",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_JAVA_OPT_10": "-Dten",
        "SPARK_JAVA_OPT_2": "-Dtwo",
        "SPARK_JAVA_OPT_0": "--add-opens=java.base/java.nio=ALL-UNNAMED",
    }
    script = REPO / "deploy" / "docker" / "spark-executor.sh"
    res = subprocess.run(["bash", str(script), "executor"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    args = res.stdout.splitlines()
    assert args[:3] == ["--add-opens=java.base/java.nio=ALL-UNNAMED", "-Dtwo", "-Dten"]
    assert args[3:5] == ["-Xms4g", "-Xmx4g"]
    assert args[5:7] == ["-cp", "/spark/conf:/spark/jars/*"]
    assert args[7] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    flags = dict(zip(args[8::2], args[9::2], strict=True))
    assert flags == {
        "--driver-url": env["SPARK_DRIVER_URL"],
        "--executor-id": "3",
        "--cores": "2",
        "--app-id": "spark-app-1",
        "--hostname": "10.0.0.9",
        "--resourceProfileId": "0",
        "--podName": "icesink-exec-3",
    }
    missing = {k: v for k, v in env.items() if k != "SPARK_DRIVER_URL"}
    res = subprocess.run(["bash", str(script), "executor"], env=missing, capture_output=True, text=True)
    assert res.returncode == 64 and "SPARK_DRIVER_URL is not set" in res.stderr
    res = subprocess.run(["bash", str(script), "driver"], env=env, capture_output=True, text=True)
    assert res.returncode == 64
