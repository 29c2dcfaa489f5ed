{{/*
Pod template of the Spark executors (Spark-on-Kubernetes mode). Spark fills in the image, resources,
environment and its own local-dir volume; the template adds the hardening and runs the image's
executor launcher instead of its `icesink` entry point.
*/}}
{{- define "icesink.executorPodTemplate" -}}
{{- $k8s := .Values.spark.kubernetes -}}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "icesink.executorLabels" . | nindent 4 }}
spec:
  {{- if eq (include "icesink.podToken" .) "true" }}
  {{- /* Workload identity: the executors write data files as the sink's account. Its token also
  carries the Role that manages executor pods; spark.kubernetes.authenticate.executor.serviceAccountName
  in spark.conf names another account bound to the same Google service account instead. */}}
  serviceAccountName: {{ include "icesink.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- else }}
  automountServiceAccountToken: false
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $k8s.executor.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $k8s.executor.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: spark-kubernetes-executor
      command: ["/opt/icesink/bin/spark-executor"]
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.scratch.tmp.sizeLimit }}
{{- end -}}
