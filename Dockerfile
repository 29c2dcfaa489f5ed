# syntax=docker/dockerfile:1
# icesink: one image for the sink (`icesink run`), its table maintenance (`icesink maintain`) and its CLI
# (`icesink status`, `icesink check`).
#
#   docker build -t icesink .                        # the sink image (default target: runtime)
#   docker build --target query -t icesink-query .   # + DuckDB, to look at the tables (compose demo)
#
# Stages: jars (Spark's Kafka source, Iceberg's Spark runtime and AWS bundle from Maven Central, SHA-256
# checked), native (the Avro batch decoder, built with Rust) and build (wheels + venv) feed runtime-base (python slim + JRE 17, non-root); query adds
# DuckDB; runtime is the default, last stage.
# No secret is baked in: credentials come from the environment at run time (docs/operations.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- jars: the Spark jars the jobs need on top of pyspark -----------------------------------------
FROM ${PYTHON_IMAGE} AS jars
ARG MAVEN_REPO=https://repo1.maven.org/maven2
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/docker/spark-jars.txt deploy/docker/fetch-jars.sh /build/
RUN MAVEN_REPO="${MAVEN_REPO}" sh /build/fetch-jars.sh /build/spark-jars.txt /opt/icesink/jars

# ---- native: the Avro batch decoder (service/native, Rust over arrow-avro) as an abi3 wheel ----------
FROM ${PYTHON_IMAGE} AS native
ARG RUST_TOOLCHAIN=1.95.0
ARG MATURIN_VERSION=1.16.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain "${RUST_TOOLCHAIN}" \
 && pip install --no-cache-dir "maturin==${MATURIN_VERSION}"
COPY service/native /src/native
RUN PATH="/root/.cargo/bin:$PATH" maturin build --release --manifest-path /src/native/Cargo.toml --out /native

# ---- build: the icesink wheel and a venv with it and its dependencies ------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY txnlog ./txnlog
COPY --from=native /native /native
# pyspark's bundled tests and examples are not needed to run the sink: dropped to keep the image smaller.
# The .pth of service/pyspark_path.py: Spark's Python processes import the installed pyspark.
RUN python -m venv /opt/icesink/venv \
 && /opt/icesink/venv/bin/pip install --upgrade pip \
 && /opt/icesink/venv/bin/pip wheel --no-deps --wheel-dir /dist . \
 && /opt/icesink/venv/bin/pip install /dist/icesink-*.whl /native/icesink_avrodec-*.whl \
 && /opt/icesink/venv/bin/python -c 'from service.pyspark_path import install; install()' \
 && find /opt/icesink/venv/lib -path '*/pyspark/*' -type d \( -name tests -o -name examples \) -prune \
      -exec rm -rf {} +

# ---- runtime-base: Python + JRE 17, non-root ---------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime-base
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java \
 && groupadd --gid 10001 icesink \
 && useradd --uid 10001 --gid 10001 --home-dir /home/icesink --create-home \
      --shell /usr/sbin/nologin icesink \
 && mkdir -p /etc/icesink /opt/icesink/conf
COPY --from=build /opt/icesink/venv /opt/icesink/venv
COPY --from=jars /opt/icesink/jars /opt/icesink/jars
COPY deploy/log4j2/log4j2-text.properties deploy/log4j2/log4j2-json.properties /opt/icesink/conf/
# Spark-on-Kubernetes executors run this image with the launcher as their command (Helm chart).
COPY --chmod=0755 deploy/docker/spark-executor.sh /opt/icesink/bin/spark-executor
ENV PATH=/opt/icesink/venv/bin:$PATH \
    JAVA_HOME=/opt/java \
    PYSPARK_PYTHON=/opt/icesink/venv/bin/python \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/icesink \
    ICESINK_SPARK_JARS=/opt/icesink/jars/spark-sql-kafka-0-10_2.13-4.1.3.jar,/opt/icesink/jars/spark-token-provider-kafka-0-10_2.13-4.0.0.jar,/opt/icesink/jars/kafka-clients-3.9.1.jar,/opt/icesink/jars/commons-pool2-2.12.1.jar,/opt/icesink/jars/iceberg-spark-runtime-4.1_2.13-1.11.0.jar,/opt/icesink/jars/iceberg-aws-bundle-1.11.0.jar,/opt/icesink/jars/iceberg-gcp-bundle-1.11.0.jar,/opt/icesink/jars/iceberg-azure-bundle-1.10.0.jar,/opt/icesink/jars/postgresql-42.7.7.jar \
    SPARK_SUBMIT_OPTS=-Dlog4j2.configurationFile=/opt/icesink/conf/log4j2-text.properties \
    ICESINK_HEALTH__PORT=8080
WORKDIR /home/icesink
USER 10001:10001
EXPOSE 8080 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ICESINK_HEALTH__PORT', '8080'), timeout=4)"]

# ---- query: runtime + DuckDB with the iceberg extension (loaded from its package, never downloaded) ----
FROM runtime-base AS query
USER root
RUN /opt/icesink/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
      duckdb==1.5.5 duckdb-extension-iceberg==1.5.5 duckdb-extension-avro==1.5.5 duckdb-extension-httpfs==1.5.5
COPY --chmod=0755 dev/compose/query.py /opt/icesink/bin/icesink-query
USER 10001:10001
HEALTHCHECK NONE
ENTRYPOINT ["python", "/opt/icesink/bin/icesink-query"]
CMD []

# ---- runtime: the default image ------------------------------------------------------------------------
FROM runtime-base AS runtime
LABEL org.opencontainers.image.title="icesink" \
      org.opencontainers.image.description="Exactly-once Debezium CDC from Kafka into Apache Iceberg" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["icesink"]
CMD ["run", "--config", "/etc/icesink/sink.yaml"]
