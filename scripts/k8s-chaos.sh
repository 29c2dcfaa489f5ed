#!/usr/bin/env bash
# Chaos test of an icesink Helm release on a real Kubernetes cluster (docs/kubernetes.md).
#
# In a loop: produce a burst of sample Debezium changes to the sink's topic, wait until the sink's pod
# is in the middle of a commit (held there by a fail point: after the txnlog precommit, before the
# Iceberg commit, or between the Iceberg commit and the txnlog commit), and delete the pod, forcefully
# (SIGKILL) or gracefully (SIGTERM). Kubernetes starts a new pod, which fences the old epoch, finishes
# the precommitted batch and resumes from the committed offsets. At the end the script waits until
# the sink has caught up and checks:
#   * the commit history: one snapshot per committed batch, sequence numbers strictly increasing
#     (never a batch twice), per-partition offsets only moving forward, the last one equal to the
#     txnlog's committed offsets and to the topic's end (nothing lost);
#   * with --query-image: the table's rows, read with DuckDB (equality deletes applied), equal the rows
#     the sample source says it must hold, key by key.
#
# The release must be dedicated to the test: a sink whose only topic receives nothing but this
# script's changes, and whose table starts empty (docs/kubernetes.md has example values).
#
#   scripts/k8s-chaos.sh -n NAMESPACE -r RELEASE [options]
#
#   -n, --namespace NS      the release's namespace (default: kubectl's current one)
#   -r, --release NAME      the Helm release (required)
#   -i, --iterations N      pod deletions (default 10)
#   -e, --events N          changes per burst (default 500); --keys N: distinct keys (default 1000)
#   --mode kill|delete|mixed  SIGKILL (--grace-period=0 --force), graceful delete, or both at random
#   --query-image IMAGE     the icesink query image (Dockerfile target `query`) for the row check
#   --seed N                first seed of the sample source, to repeat a run (default random)
#   --timeout SECONDS       limit of every wait (default 600)
#
# Needs kubectl (with rights to exec into, delete and create pods and to patch the Deployment) and
# python3 on this machine; everything else runs in the cluster with the release's own image.
set -euo pipefail

namespace=""
release=""
iterations=10
events=500
keys=1000
mode=mixed
query_image=""
timeout=600
seed=$((RANDOM * 100))
FAILPOINTS="after_precommit=delay:5,during_catalog_commit=delay:5,after_catalog_commit=delay:5"
WINDOWS=(after_precommit during_catalog_commit after_catalog_commit)

say() { printf '[chaos %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e 's/^# \{0,1\}//' -e '$d' >&2; exit 2; }

while (($#)); do
  case $1 in
    -n | --namespace) namespace=$2; shift 2 ;;
    -r | --release) release=$2; shift 2 ;;
    -i | --iterations) iterations=$2; shift 2 ;;
    -e | --events) events=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --query-image) query_image=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h | --help) usage ;;
    *) say "unknown argument: $1"; usage ;;
  esac
done
[[ -n $release ]] || usage
[[ $mode =~ ^(kill|delete|mixed)$ ]] || die "--mode must be kill, delete or mixed"
command -v kubectl >/dev/null || die "kubectl is not installed"
command -v python3 >/dev/null || die "python3 is not installed"
kc=(kubectl)
[[ -n $namespace ]] && kc+=(--namespace "$namespace")

selector="app.kubernetes.io/instance=$release,app.kubernetes.io/component=sink"
deployments=$("${kc[@]}" get deployment -l "$selector" -o name 2>/dev/null) ||
  die "cannot list Deployments: is kubectl's context pointing at the cluster (kubectl config current-context)?"
deploy=$(head -1 <<<"$deployments")
[[ -n $deploy ]] || die "no icesink Deployment with labels $selector${namespace:+ in namespace $namespace}"
say "release $release: $deploy"

sink_pod() { # the newest Running pod of the sink
  "${kc[@]}" get pods -l "$selector" --field-selector=status.phase=Running \
    --sort-by=.metadata.creationTimestamp -o jsonpath='{.items[-1:].metadata.name}' 2>/dev/null || true
}

wait_ready() { # wait until a pod other than $1 is Ready; prints its name
  local old=$1 deadline=$((SECONDS + timeout)) pod
  while ((SECONDS < deadline)); do
    pod=$(sink_pod)
    if [[ -n $pod && $pod != "$old" ]] &&
      [[ $("${kc[@]}" get pod "$pod" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; then
      echo "$pod"
      return 0
    fi
    sleep 2
  done
  die "no ready sink pod after ${timeout}s (kubectl describe $deploy; kubectl logs -l $selector)"
}

in_pod() { # in_pod POD: run the Python program on stdin inside the sink's container
  "${kc[@]}" exec -i "$1" -c icesink -- python - "${@:2}"
}

cleanup() {
  say "disarming the fail points"
  "${kc[@]}" set env "$deploy" ICESINK_FAILPOINTS- >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ---- arm the fail points (a rollout: the new pod holds its first commit in each window for 5 s) ----
say "arming fail points: $FAILPOINTS"
old=$(sink_pod)
"${kc[@]}" set env "$deploy" "ICESINK_FAILPOINTS=$FAILPOINTS" >/dev/null
"${kc[@]}" rollout status "$deploy" --timeout="${timeout}s" >&2
pod=$(wait_ready "$old")

PRODUCE=$(cat <<'PY'
import json
import os
import sys

from confluent_kafka import Producer

from service.config import load_config
from service.sample import SampleSource
from service.kafka.lookups import client_config

seed, events, keys = (int(a) for a in sys.argv[1:4])
config = load_config(os.environ.get("ICESINK_CONFIG", "/etc/icesink/sink.yaml"))
(topic,) = config.kafka.topics
source = SampleSource(keys=keys, seed=seed)
producer = Producer(client_config(config.kafka, **{"enable.idempotence": True, "linger.ms": 20}))
for _ in range(events):
    change = source.next_change()
    producer.produce(topic, key=json.dumps(change.key), value=json.dumps(change.value))
    producer.poll(0)
assert producer.flush(60) == 0, "undelivered changes"
print(f"produced {events} changes (seed {seed}) to {topic}")
PY
)

fired() { # the fail points this pod has already passed (each fires once per process)
  "${kc[@]}" logs "$1" -c icesink 2>/dev/null | grep -o 'fail point [a-z_]*' | sed 's/fail point //' | sort -u || true
}

# ---- the loop ------------------------------------------------------------------------------------------
for ((i = 1; i <= iterations; i++)); do
  burst_seed=$((seed + i))
  in_pod "$pod" "$burst_seed" "$events" "$keys" <<<"$PRODUCE" >&2 || die "producing burst $i failed"
  how=$mode
  [[ $mode == mixed ]] && how=$([[ $((RANDOM % 2)) == 0 ]] && echo kill || echo delete)
  # A new pod that recovered a precommitted batch has already passed the Iceberg-commit windows:
  # pick one it has not passed yet (after_precommit is only passed by a new batch).
  used=$(fired "$pod")
  open=()
  for w in "${WINDOWS[@]}"; do grep -qx "$w" <<<"$used" || open+=("$w"); done
  if ((${#open[@]} == 0)); then
    say "iteration $i/$iterations: $pod has passed every window; ${how}ing it at a random moment"
    sleep $((RANDOM % 5))
  else
    window=${open[RANDOM % ${#open[@]}]}
    say "iteration $i/$iterations: waiting for $pod to be held in $window, then ${how}ing it"
    deadline=$((SECONDS + timeout))
    until fired "$pod" | grep -qx "$window"; do
      ((SECONDS < deadline)) || die "pod $pod never reached fail point $window (is the sink committing? kubectl logs $pod)"
      sleep 0.5
    done
  fi
  if [[ $how == kill ]]; then
    "${kc[@]}" delete pod "$pod" --grace-period=0 --force --wait=false >/dev/null 2>&1
  else
    "${kc[@]}" delete pod "$pod" --wait=false >/dev/null
  fi
  pod=$(wait_ready "$pod")
  say "iteration $i/$iterations: $pod is ready"
done

# ---- catch up without fail points, then check ---------------------------------------------------------
cleanup
trap - EXIT
"${kc[@]}" rollout status "$deploy" --timeout="${timeout}s" >&2
pod=$(wait_ready "")

CHECK=$(cat <<'PY'
import json
import os
import sys
import time

from service.commit.plan import SUMMARY_OFFSETS, SUMMARY_SEQ, SUMMARY_SINK_ID, PendingCommit
from service.config import load_config
from service.iceberg.tables import open_catalog
from service.kafka.lookups import end_offsets, partitions
from txnlog import TransactionLog

deadline = time.monotonic() + float(sys.argv[1])
config = load_config(os.environ.get("ICESINK_CONFIG", "/etc/icesink/sink.yaml"))
log = TransactionLog(config.txnlog.dsn, schema=config.txnlog.schema_name)
target = end_offsets(config.kafka, partitions(config.kafka))


def committed() -> dict:
    state = log.state(config.sink_id)
    if state is None or not state.committed_payload:
        return {}
    return PendingCommit.from_payload(state.committed_payload).offsets


def caught_up() -> bool:
    done = committed()
    return all(done.get(t, {}).get(p, 0) >= end for t, parts in target.items() for p, end in parts.items())


while not caught_up():
    if time.monotonic() > deadline:
        sys.exit(f"FAILED: not caught up: committed {committed()} vs end of topic {target}")
    time.sleep(5)
print(f"caught up: {target}")

table = open_catalog(config).load_table(config.table.identifier)
seqs, last = [], {}
problems = []
for snap in table.metadata.snapshots:
    summary = snap.summary
    if summary is None or summary.get(SUMMARY_SINK_ID) != config.sink_id:
        continue
    seq = int(summary.get(SUMMARY_SEQ))
    offsets = json.loads(summary.get(SUMMARY_OFFSETS))
    if seqs and seq <= seqs[-1]:
        problems.append(f"snapshot {snap.snapshot_id}: seq {seq} after seq {seqs[-1]} (a batch committed twice?)")
    for topic, parts in offsets.items():
        for p, o in parts.items():
            before = last.get((topic, int(p)), -1)
            if o < before:
                problems.append(f"snapshot {snap.snapshot_id}: {topic}/{p} offset went back {before} -> {o}")
            last[(topic, int(p))] = o
    seqs.append(seq)
state = log.state(config.sink_id)
if not seqs:
    problems.append("no snapshot of this sink in the table")
elif seqs[-1] > state.committed_seq:
    problems.append(f"table has seq {seqs[-1]} but the txnlog committed only {state.committed_seq}")
done = {(t, p): o for t, ps in committed().items() for p, o in ps.items()}
for key, offset in last.items():
    if done.get(key, -1) < offset:
        problems.append(f"{key}: table has offset {offset}, txnlog {done.get(key)}")
print(f"{len(seqs)} snapshots, seq {seqs[0] if seqs else '-'}..{seqs[-1] if seqs else '-'}, "
      f"txnlog epoch {state.epoch} committed seq {state.committed_seq}")
if problems:
    sys.exit("FAILED:\n  " + "\n  ".join(problems))
print("commit history ok")
PY
)
say "waiting for the sink to catch up, then checking the commit history"
in_pod "$pod" "$timeout" <<<"$CHECK" >&2 || die "commit history check"

if [[ -z $query_image ]]; then
  say "done: $iterations pod deletions mid-commit, commit history consistent (add --query-image for the row check)"
  exit 0
fi

# ---- row-by-row check with DuckDB, in a pod built from the sink's pod template --------------------------
ROWS=$(cat <<'PY'
import importlib.machinery
import importlib.util
import os
import sys
from decimal import Decimal

from service.config import load_config
from service.sample import SampleSource

first, count, events, keys = (int(a) for a in sys.argv[1:5])
config = load_config(os.environ.get("ICESINK_CONFIG", "/etc/icesink/sink.yaml"))
# the query tool of the image, pointed at the sink's REST catalog and S3 store
catalog = config.catalog
os.environ.update(
    ICESINK_REST_URI=catalog["uri"],
    ICESINK_QUERY_WAREHOUSE=catalog.get("warehouse", "warehouse"),
    ICESINK_S3_ENDPOINT=catalog.get("s3.endpoint", "https://s3.amazonaws.com"),
    AWS_ACCESS_KEY_ID=catalog.get("s3.access-key-id", os.environ.get("AWS_ACCESS_KEY_ID", "")),
    AWS_SECRET_ACCESS_KEY=catalog.get("s3.secret-access-key", os.environ.get("AWS_SECRET_ACCESS_KEY", "")),
    AWS_REGION=catalog.get("s3.region", os.environ.get("AWS_REGION", "us-east-1")),
)
tool = os.environ.get("ICESINK_QUERY_TOOL", "/opt/icesink/bin/icesink-query")
loader = importlib.machinery.SourceFileLoader("icesink_query", tool)  # a script without .py
spec = importlib.util.spec_from_loader("icesink_query", loader)
assert spec is not None
query = importlib.util.module_from_spec(spec)
loader.exec_module(query)

expected = {}
for burst_seed in range(first, first + count):
    source = SampleSource(keys=keys, seed=burst_seed)
    for _ in range(events):
        change = source.next_change()
        key = change.key["payload"]["id"] if "payload" in change.key else change.key["id"]
        if change.row is None:
            expected.pop(key, None)
        else:
            expected[key] = (change.row["name"], Decimal(change.row["amount"]))
con = query.connect()
rows = con.execute(f"SELECT id, name, amount FROM {query.quoted(config.table.identifier)}").fetchall()
actual, duplicates = {}, []
for key, name, amount in rows:
    if key in actual:
        duplicates.append(key)
    actual[key] = (name, Decimal(amount))
missing = sorted(set(expected) - set(actual))
extra = sorted(set(actual) - set(expected))
wrong = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
print(f"expected {len(expected)} rows, table has {len(rows)}")
if duplicates or missing or extra or wrong:
    sys.exit(
        f"FAILED: duplicate keys {duplicates[:10]}, missing {missing[:10]}, unexpected {extra[:10]}, "
        f"different {wrong[:10]}"
    )
print("rows ok: the table holds exactly the source's rows")
PY
)
checker="icesink-chaos-check-$RANDOM"
say "row check: pod $checker ($query_image)"
"${kc[@]}" get "$deploy" -o json | python3 -c '
import json, sys
deploy = json.load(sys.stdin)
name, image = sys.argv[1], sys.argv[2]
spec = deploy["spec"]["template"]["spec"]
container = spec["containers"][0]
container.update(name="check", image=image, command=["python", "-c", sys.argv[3]], args=sys.argv[4:])
for key in ("livenessProbe", "readinessProbe", "ports"):
    container.pop(key, None)
container["env"] = [e for e in container.get("env", []) if e["name"] != "ICESINK_FAILPOINTS"]
spec["containers"] = [container]
spec["restartPolicy"] = "Never"
labels = {"app.kubernetes.io/instance": deploy["metadata"]["labels"].get("app.kubernetes.io/instance", ""),
          "app.kubernetes.io/component": "chaos-check"}
print(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}))
' "$checker" "$query_image" "$ROWS" "$((seed + 1))" "$iterations" "$events" "$keys" | "${kc[@]}" create -f - >/dev/null
deadline=$((SECONDS + timeout))
while :; do
  phase=$("${kc[@]}" get pod "$checker" -o jsonpath='{.status.phase}')
  [[ $phase == Succeeded || $phase == Failed ]] && break
  ((SECONDS < deadline)) || { "${kc[@]}" delete pod "$checker" --wait=false >/dev/null; die "row check timed out"; }
  sleep 3
done
"${kc[@]}" logs "$checker" >&2 || true
"${kc[@]}" delete pod "$checker" --wait=false >/dev/null
[[ $phase == Succeeded ]] || die "row check"
say "done: $iterations pod deletions mid-commit; commit history and rows exact"
