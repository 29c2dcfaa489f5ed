#!/bin/bash
# Spark-on-Kubernetes executor launcher for the icesink image (whose entry point is `icesink`).
#
# Spark's driver creates executor pods that pass their settings as environment variables
# (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES, SPARK_EXECUTOR_MEMORY,
# SPARK_APPLICATION_ID, SPARK_EXECUTOR_POD_IP, SPARK_EXECUTOR_POD_NAME, SPARK_RESOURCE_PROFILE_ID and
# JVM options as SPARK_JAVA_OPT_<n>) and the argument `executor`. The Helm chart's executor pod
# template runs this script as the container command; it starts Spark's Kubernetes executor backend
# from the jars of the pyspark package, with the image's Python for the Python workers.
set -euo pipefail

if [[ ${1:-} != executor ]]; then
  echo "spark-executor: expected the argument 'executor' (got: $*)" >&2
  exit 64
fi
python=${PYSPARK_PYTHON:-/opt/icesink/venv/bin/python}
export PYSPARK_PYTHON=$python
spark_home=${SPARK_HOME:-$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}
export SPARK_HOME=$spark_home

classpath="${SPARK_CONF_DIR:-$spark_home/conf}:$spark_home/jars/*"
if [[ -n ${SPARK_EXTRA_CLASSPATH:-} ]]; then
  classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
fi

# JVM options in their numeric order: SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
java_opts=()
while IFS= read -r name; do
  java_opts+=("${!name}")
done < <(compgen -e | grep '^SPARK_JAVA_OPT_[0-9]*$' | sort -t_ -k4 -n)

for required in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
  SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP; do
  if [[ -z ${!required:-} ]]; then
    echo "spark-executor: $required is not set (is this pod created by a Spark driver?)" >&2
    exit 64
  fi
done

exec "${JAVA_HOME:-/opt/java}/bin/java" \
  "${java_opts[@]}" \
  -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
  -cp "$classpath" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
  --podName "${SPARK_EXECUTOR_POD_NAME:-${HOSTNAME:-}}"
