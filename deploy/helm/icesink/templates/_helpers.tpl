{{/* Names and labels. */}}
{{- define "icesink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "icesink.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "icesink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "icesink.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "icesink.sinkSelectorLabels" -}}
{{ include "icesink.selectorLabels" . }}
app.kubernetes.io/component: sink
{{- end -}}

{{- define "icesink.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "icesink.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: icesink
{{- end -}}

{{- define "icesink.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "icesink.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "icesink.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Whether the pods get the service account's token (serviceAccount.automountToken, by default only with
GKE workload identity, whose metadata server serves a pod by its token). The sink's pod also gets it in
Spark-on-Kubernetes mode, to manage its executors: icesink.sinkToken.
*/}}
{{- define "icesink.podToken" -}}
{{- $sa := .Values.serviceAccount -}}
{{- if kindIs "bool" $sa.automountToken -}}
{{- $sa.automountToken -}}
{{- else -}}
{{- hasKey ($sa.annotations | default dict) "iam.gke.io/gcp-service-account" -}}
{{- end -}}
{{- end -}}

{{- define "icesink.sinkToken" -}}
{{- or .Values.spark.kubernetes.enabled (eq (include "icesink.podToken" .) "true") -}}
{{- end -}}

{{- define "icesink.executorLabels" -}}
{{ include "icesink.selectorLabels" . }}
app.kubernetes.io/component: spark-executor
{{- end -}}

{{/*
The sink.yaml: .Values.config plus what the chart owns (health and metrics ports, the Spark master and
the Spark settings the pod layout needs). Spark settings are strings, as icesink's config expects.
*/}}
{{- define "icesink.sinkConfig" -}}
{{- include "icesink.renderConfig" (dict "root" . "maintain" false) -}}
{{- end -}}

{{/*
The maintain.yaml of `icesink maintain` (maintenance.enabled): the same sink (sink_id, catalog, txnlog,
config.maintenance, ...), with Spark in local mode in the maintainer's own pod (maintenance.spark) and
a Prometheus endpoint only for the long-running Deployment (a CronJob's pods are gone before a scrape).
*/}}
{{- define "icesink.maintainConfig" -}}
{{- include "icesink.renderConfig" (dict "root" . "maintain" true) -}}
{{- end -}}

{{- define "icesink.renderConfig" -}}
{{- $root := .root -}}
{{- $maintain := .maintain -}}
{{- $v := $root.Values -}}
{{- $cfg := deepCopy $v.config -}}
{{- $spark := deepCopy (default (dict) (get $cfg "spark")) -}}
{{- $conf := dict "spark.ui.showConsoleProgress" "false" -}}
{{- range $k, $val := (default (dict) (get $spark "conf")) }}{{ $_ := set $conf $k (toString $val) }}{{ end -}}
{{- range $k, $val := $v.spark.conf }}{{ $_ := set $conf $k (toString $val) }}{{ end -}}
{{- $_ := set $conf "spark.driver.memory" (toString (ternary $v.maintenance.spark.driverMemory $v.spark.driverMemory $maintain)) -}}
{{- $_ := set $conf "spark.local.dir" $v.scratch.sparkLocal.path -}}
{{- if and $v.spark.kubernetes.enabled (not $maintain) -}}
{{- $k8s := $v.spark.kubernetes -}}
{{- $_ := set $spark "master" "k8s://https://kubernetes.default.svc:443" -}}
{{- $_ := set $conf "spark.submit.deployMode" "client" -}}
{{- $_ := set $conf "spark.kubernetes.namespace" $root.Release.Namespace -}}
{{- $_ := set $conf "spark.kubernetes.container.image" (default (include "icesink.image" $root) $k8s.executor.image) -}}
{{- $_ := set $conf "spark.kubernetes.container.image.pullPolicy" $v.image.pullPolicy -}}
{{- $_ := set $conf "spark.kubernetes.driver.pod.name" "${POD_NAME}" -}}
{{- $_ := set $conf "spark.kubernetes.executor.podNamePrefix" (include "icesink.fullname" $root | trunc 40 | trimSuffix "-") -}}
{{- $_ := set $conf "spark.kubernetes.executor.podTemplateFile" "/etc/icesink/executor-pod-template.yaml" -}}
{{- $_ := set $conf "spark.kubernetes.authenticate.caCertFile" "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" -}}
{{- $_ := set $conf "spark.kubernetes.authenticate.oauthTokenFile" "/var/run/secrets/kubernetes.io/serviceaccount/token" -}}
{{- /* the driver's headless Service (spark-driver-service.yaml); one pod behind it: Recreate */ -}}
{{- $_ := set $conf "spark.driver.host" (printf "%s.%s.svc" (include "icesink.driverService" $root) $root.Release.Namespace) -}}
{{- $_ := set $conf "spark.driver.bindAddress" "0.0.0.0" -}}
{{- $_ := set $conf "spark.driver.port" (toString $k8s.driverPort) -}}
{{- $_ := set $conf "spark.driver.blockManager.port" (toString $k8s.blockManagerPort) -}}
{{- $_ := set $conf "spark.blockManager.port" (toString $k8s.blockManagerPort) -}}
{{- $_ := set $conf "spark.executor.instances" (toString $k8s.executor.instances) -}}
{{- $_ := set $conf "spark.executor.cores" (toString $k8s.executor.cores) -}}
{{- $_ := set $conf "spark.executor.memory" (toString $k8s.executor.memory) -}}
{{- $_ := set $conf "spark.executor.memoryOverhead" (toString $k8s.executor.memoryOverhead) -}}
{{- if not $k8s.persistentVolumeClaims -}}
{{- /* the executors' scratch is the pod template's emptyDir: no claim to create, own or reuse */ -}}
{{- $_ := set $conf "spark.kubernetes.driver.ownPersistentVolumeClaim" "false" -}}
{{- $_ := set $conf "spark.kubernetes.driver.reusePersistentVolumeClaim" "false" -}}
{{- end -}}
{{- else -}}
{{- $_ := set $spark "master" (ternary $v.maintenance.spark.master $v.spark.master $maintain) -}}
{{- end -}}
{{- $_ := set $spark "conf" $conf -}}
{{- $_ := set $cfg "spark" $spark -}}
{{- $_ := set $cfg "health" (dict "port" (int $v.health.port) "host" "0.0.0.0") -}}
{{- $metrics := dict "export_interval" $v.metrics.exportInterval -}}
{{- $prometheus := and $v.metrics.prometheus.enabled (or (not $maintain) (eq $v.maintenance.mode "deployment")) -}}
{{- if $prometheus }}{{ $_ := set $metrics "prometheus_port" (int $v.metrics.prometheus.port) }}{{ end -}}
{{- if $v.metrics.otlp.endpoint }}{{ $_ := set $metrics "otlp_endpoint" $v.metrics.otlp.endpoint }}{{ end -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "icesink.logFormat" -}}
{{- $log := default (dict) .Values.config.log -}}
{{- default "text" (get $log "format") -}}
{{- end -}}

{{/* Fail early on values the schema cannot express. */}}
{{- define "icesink.validate" -}}
{{- if not .Values.credentials.existingSecret -}}
{{- fail "credentials.existingSecret is required: create a Secret with the sink's credentials (see docs/kubernetes.md)" -}}
{{- end -}}
{{- $txnlog := default (dict) .Values.config.txnlog -}}
{{- if not (or (hasKey $txnlog "dsn") (hasKey .Values.credentials.env "ICESINK_TXNLOG__DSN")) -}}
{{- fail "the txnlog DSN is missing: map ICESINK_TXNLOG__DSN to a key of the Secret in credentials.env" -}}
{{- end -}}
{{- $kafka := default (dict) .Values.config.kafka -}}
{{- if and (get $kafka "topics") (get $kafka "topic_pattern") -}}
{{- fail "config.kafka: set one of topics (a list of topics) and topic_pattern (a regex), not both" -}}
{{- end -}}
{{- $identifier := toString (get (default (dict) .Values.config.table) "identifier") -}}
{{- if not (contains "{" $identifier) -}}
{{- range $name, $_ := (default (dict) .Values.config.tables) -}}
{{- if ne $name $identifier -}}
{{- fail (printf "config.tables.%s: the sink writes only %s (config.table.identifier is not a template such as lake.{source.table})" $name $identifier) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.spark.kubernetes.enabled (eq .Values.updateStrategy.type "RollingUpdate") -}}
{{- fail "updateStrategy.type RollingUpdate with spark.kubernetes.enabled: executors call the driver by its Service's name, which must stand for one pod; leave updateStrategy.type empty (Recreate in this mode) or set Recreate" -}}
{{- end -}}
{{- if .Values.maintenance.enabled -}}
{{- /* as service/maintenance/spark.py: the catalog must be one Spark's Iceberg catalogs know, or described */ -}}
{{- $kind := toString (default "rest" (get (default (dict) .Values.config.catalog) "type")) -}}
{{- $given := default (dict) (get (default (dict) .Values.config.maintenance) "spark_catalog") -}}
{{- if not (or (has $kind (list "rest" "glue" "hive" "sql")) (contains "${" $kind) (hasKey $given "type") (hasKey $given "catalog-impl")) -}}
{{- fail (printf "maintenance: the catalog type %s has no Spark equivalent icesink knows; describe the catalog to Spark in config.maintenance.spark_catalog (type or catalog-impl, and its properties)" $kind) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Parts the sink's Deployment and the maintainer's CronJob or Deployment share, so both pods see the
same configuration, credentials (Secret references only), scratch volumes and hardening.
*/}}

{{/* The pod's identity and hardening (pod spec keys; the token is mounted per pod kind). */}}
{{- define "icesink.podSecurity" -}}
serviceAccountName: {{ include "icesink.serviceAccountName" . }}
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Where the pod may run (pod spec keys). */}}
{{- define "icesink.podScheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container's environment: the pod's own coordinates, scratch and logging settings, the
credentials as references to keys of credentials.existingSecret, extraEnv and extraEnvFrom. */}}
{{- define "icesink.containerEnv" -}}
env:
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: ICESINK_HEALTH__PORT
    value: {{ .Values.health.port | quote }}
  - name: TMPDIR
    value: /tmp
  - name: SPARK_LOCAL_DIRS
    value: {{ .Values.scratch.sparkLocal.path | quote }}
  - name: SPARK_SUBMIT_OPTS
    value: "-Dlog4j2.configurationFile=/opt/icesink/conf/log4j2-{{ include "icesink.logFormat" . }}.properties"
  {{- range $name, $key := .Values.credentials.env }}
  - name: {{ $name }}
    valueFrom:
      secretKeyRef:
        name: {{ $.Values.credentials.existingSecret }}
        key: {{ $key }}
  {{- end }}
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.extraEnvFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container's mounts: the ConfigMap (sink.yaml, maintain.yaml) read-only, and the scratch volumes. */}}
{{- define "icesink.volumeMounts" -}}
volumeMounts:
  - name: config
    mountPath: /etc/icesink
    readOnly: true
  - name: tmp
    mountPath: /tmp
  - name: spark-local
    mountPath: {{ .Values.scratch.sparkLocal.path }}
{{- end -}}

{{/* The pod's volumes: the ConfigMap and two size-limited emptyDirs (the root file system is read-only). */}}
{{- define "icesink.volumes" -}}
volumes:
  - name: config
    configMap:
      name: {{ include "icesink.fullname" . }}
  - name: tmp
    emptyDir:
      {{- with .Values.scratch.tmp.medium }}
      medium: {{ . }}
      {{- end }}
      sizeLimit: {{ .Values.scratch.tmp.sizeLimit }}
  - name: spark-local
    emptyDir:
      {{- with .Values.scratch.sparkLocal.medium }}
      medium: {{ . }}
      {{- end }}
      sizeLimit: {{ .Values.scratch.sparkLocal.sizeLimit }}
{{- end -}}

{{/* The maintainer's name (<= 52 characters, a CronJob's limit) and labels. */}}
{{- define "icesink.maintenanceName" -}}
{{- printf "%s-maintenance" (include "icesink.fullname" . | trunc 40 | trimSuffix "-") -}}
{{- end -}}

{{- define "icesink.maintenanceSelectorLabels" -}}
{{ include "icesink.selectorLabels" . }}
app.kubernetes.io/component: maintenance
{{- end -}}

{{/*
The maintainer's pod template ((dict "root" . "args" <container args>)): the sink's pod without its
health port, probes and service account token, running `icesink maintain`.
*/}}
{{- define "icesink.maintenancePod" -}}
{{- $m := .root.Values.maintenance -}}
metadata:
  labels:
    {{- include "icesink.maintenanceSelectorLabels" .root | nindent 4 }}
    {{- with $m.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "icesink.maintainConfig" .root | sha256sum }}
    {{- with $m.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- include "icesink.podSecurity" .root | nindent 2 }}
  # Local-mode Spark: the maintainer never calls the Kubernetes API (a token for workload identity only).
  automountServiceAccountToken: {{ include "icesink.podToken" .root }}
  terminationGracePeriodSeconds: {{ $m.terminationGracePeriodSeconds }}
  {{- if eq $m.mode "cronjob" }}
  restartPolicy: Never
  {{- end }}
  containers:
    - name: maintain
      image: {{ include "icesink.image" .root }}
      imagePullPolicy: {{ .root.Values.image.pullPolicy }}
      args:
        {{- toYaml .args | nindent 8 }}
      securityContext:
        {{- toYaml .root.Values.securityContext | nindent 8 }}
      {{- if and (eq $m.mode "deployment") .root.Values.metrics.prometheus.enabled }}
      ports:
        - name: metrics
          containerPort: {{ .root.Values.metrics.prometheus.port }}
          protocol: TCP
      {{- end }}
      {{- include "icesink.containerEnv" .root | nindent 6 }}
      resources:
        {{- toYaml $m.resources | nindent 8 }}
      {{- include "icesink.volumeMounts" .root | nindent 6 }}
  {{- include "icesink.volumes" .root | nindent 2 }}
  {{- with include "icesink.podScheduling" .root | trim }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Egress rules of the sink's and the maintainer's NetworkPolicies: DNS, then anything
(networkPolicy.allowAllEgress) or the destinations in networkPolicy.egress. */}}
{{- define "icesink.egressRules" -}}
{{- $np := .Values.networkPolicy -}}
# DNS
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- if $np.allowAllEgress }}
- {}
{{- else }}
{{- with $np.egress }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The driver's headless Service: the name Spark-on-Kubernetes executors call the driver by. */}}
{{- define "icesink.driverService" -}}
{{- printf "%s-driver" (include "icesink.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{/* RollingUpdate unless executors call the driver by name (then one pod at a time: Recreate). */}}
{{- define "icesink.updateStrategy" -}}
{{- default (ternary "Recreate" "RollingUpdate" .Values.spark.kubernetes.enabled) .Values.updateStrategy.type -}}
{{- end -}}
