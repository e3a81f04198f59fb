{{/* Names: with release name "specroute" they are deploy/k8s's names (specroute-gateway, -config, -keys). */}}
{{- define "specroute.fullname" -}}
{{- printf "%s-gateway" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specroute.configName" -}}
{{- printf "%s-config" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specroute.secretName" -}}
{{- default (printf "%s-keys" .Release.Name | trunc 63 | trimSuffix "-") .Values.auth.existingSecret -}}
{{- end -}}

{{/* The selector: stable across upgrades, so only the name label. */}}
{{- define "specroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specroute.fullname" . }}
{{- end -}}

{{- define "specroute.labels" -}}
{{ include "specroute.selectorLabels" . }}
app.kubernetes.io/part-of: specroute
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}
