{{- define "tritongen.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tritongen.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tritongen.labels" -}}
{{ include "tritongen.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The port Prometheus scrapes: Triton's metrics port, or the OpenAI server's own. */}}
{{- define "tritongen.metricsPortName" -}}
{{- if eq .Values.frontend "openai" -}}http{{- else -}}metrics{{- end -}}
{{- end -}}

{{/* 0,1,...,N-1: rank r of the engine uses the r-th visible GPU. */}}
{{- define "tritongen.cudaVisibleDevices" -}}
{{- $ids := list -}}
{{- range $i := until (int .Values.model.tensorParallelSize) -}}
{{- $ids = append $ids (toString $i) -}}
{{- end -}}
{{- join "," $ids -}}
{{- end -}}

{{- define "tritongen.claimName" -}}
{{- if .Values.modelCache.persistentVolumeClaim.existingClaim -}}
{{- .Values.modelCache.persistentVolumeClaim.existingClaim -}}
{{- else -}}
{{- printf "%s-model-cache" (include "tritongen.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "tritongen.validate" -}}
{{- if not (has .Values.frontend (list "triton" "openai")) -}}
{{- fail (printf "frontend must be triton or openai, not %q" .Values.frontend) -}}
{{- end -}}
{{- if not (has .Values.workload.kind (list "Deployment" "StatefulSet")) -}}
{{- fail (printf "workload.kind must be Deployment or StatefulSet, not %q" .Values.workload.kind) -}}
{{- end -}}
{{- if lt (int .Values.model.tensorParallelSize) 1 -}}
{{- fail "model.tensorParallelSize must be at least 1" -}}
{{- end -}}
{{- if and .Values.autoscaling.hpa.enabled .Values.autoscaling.keda.enabled -}}
{{- fail "autoscaling: enable hpa or keda, not both (KEDA creates its own HPA)" -}}
{{- end -}}
{{- if and .Values.inferencePool.enabled (ne .Values.frontend "openai") -}}
{{- fail "inferencePool needs frontend: openai (the endpoint picker routes OpenAI requests)" -}}
{{- end -}}
{{- if lt (int .Values.termination.gracePeriodSeconds) (add (int .Values.termination.preStopSleepSeconds) (int .Values.termination.drainSeconds) 5) -}}
{{- fail "termination.gracePeriodSeconds must exceed preStopSleepSeconds + drainSeconds (+5 s to exit)" -}}
{{- end -}}
{{- end -}}
