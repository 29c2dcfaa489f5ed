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
  automountServiceAccountToken: false
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
