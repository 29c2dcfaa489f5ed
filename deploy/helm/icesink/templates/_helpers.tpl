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

{{- define "icesink.executorLabels" -}}
{{ include "icesink.selectorLabels" . }}
app.kubernetes.io/component: spark-executor
{{- end -}}

{{/*
The sink.yaml: .Values.config plus what the chart owns (health and metrics ports, the Spark master and
the Spark settings the pod layout needs). Spark settings are strings, as icesink's config expects.
*/}}
{{- define "icesink.sinkConfig" -}}
{{- $v := .Values -}}
{{- $cfg := deepCopy $v.config -}}
{{- $spark := deepCopy (default (dict) (get $cfg "spark")) -}}
{{- $conf := dict "spark.ui.showConsoleProgress" "false" -}}
{{- range $k, $val := (default (dict) (get $spark "conf")) }}{{ $_ := set $conf $k (toString $val) }}{{ end -}}
{{- range $k, $val := $v.spark.conf }}{{ $_ := set $conf $k (toString $val) }}{{ end -}}
{{- $_ := set $conf "spark.driver.memory" (toString $v.spark.driverMemory) -}}
{{- $_ := set $conf "spark.local.dir" $v.scratch.sparkLocal.path -}}
{{- if $v.spark.kubernetes.enabled -}}
{{- $k8s := $v.spark.kubernetes -}}
{{- $_ := set $spark "master" "k8s://https://kubernetes.default.svc:443" -}}
{{- $_ := set $conf "spark.submit.deployMode" "client" -}}
{{- $_ := set $conf "spark.kubernetes.namespace" .Release.Namespace -}}
{{- $_ := set $conf "spark.kubernetes.container.image" (default (include "icesink.image" .) $k8s.executor.image) -}}
{{- $_ := set $conf "spark.kubernetes.container.image.pullPolicy" $v.image.pullPolicy -}}
{{- $_ := set $conf "spark.kubernetes.driver.pod.name" "${POD_NAME}" -}}
{{- $_ := set $conf "spark.kubernetes.executor.podNamePrefix" (include "icesink.fullname" . | trunc 40 | trimSuffix "-") -}}
{{- $_ := set $conf "spark.kubernetes.executor.podTemplateFile" "/etc/icesink/executor-pod-template.yaml" -}}
{{- $_ := set $conf "spark.kubernetes.authenticate.caCertFile" "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" -}}
{{- $_ := set $conf "spark.kubernetes.authenticate.oauthTokenFile" "/var/run/secrets/kubernetes.io/serviceaccount/token" -}}
{{- $_ := set $conf "spark.driver.host" "${POD_IP}" -}}
{{- $_ := set $conf "spark.driver.bindAddress" "0.0.0.0" -}}
{{- $_ := set $conf "spark.driver.port" (toString $k8s.driverPort) -}}
{{- $_ := set $conf "spark.driver.blockManager.port" (toString $k8s.blockManagerPort) -}}
{{- $_ := set $conf "spark.blockManager.port" (toString $k8s.blockManagerPort) -}}
{{- $_ := set $conf "spark.executor.instances" (toString $k8s.executor.instances) -}}
{{- $_ := set $conf "spark.executor.cores" (toString $k8s.executor.cores) -}}
{{- $_ := set $conf "spark.executor.memory" (toString $k8s.executor.memory) -}}
{{- $_ := set $conf "spark.executor.memoryOverhead" (toString $k8s.executor.memoryOverhead) -}}
{{- else -}}
{{- $_ := set $spark "master" $v.spark.master -}}
{{- end -}}
{{- $_ := set $spark "conf" $conf -}}
{{- $_ := set $cfg "spark" $spark -}}
{{- $_ := set $cfg "health" (dict "port" (int $v.health.port) "host" "0.0.0.0") -}}
{{- $metrics := dict "export_interval" $v.metrics.exportInterval -}}
{{- if $v.metrics.prometheus.enabled }}{{ $_ := set $metrics "prometheus_port" (int $v.metrics.prometheus.port) }}{{ end -}}
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
{{- end -}}
