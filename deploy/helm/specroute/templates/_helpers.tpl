{{/*
Names: with release name "specroute" and no overrides they are deploy/k8s's names (specroute-gateway,
-config, -keys). nameOverride replaces "gateway" after the release name; fullnameOverride replaces the
whole name, and the ConfigMap and Secret of keys are then named after it (<fullnameOverride>-config).
*/}}
{{- define "specroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (default "gateway" .Values.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specroute.prefix" -}}
{{- default .Release.Name .Values.fullnameOverride -}}
{{- end -}}

{{- define "specroute.configName" -}}
{{- printf "%s-config" (include "specroute.prefix" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specroute.secretName" -}}
{{- default (printf "%s-keys" (include "specroute.prefix" .) | trunc 63 | trimSuffix "-") .Values.auth.existingSecret -}}
{{- end -}}

{{- define "specroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specroute.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* No image is published: the repository must be set to the operator's own copy. */}}
{{- define "specroute.image" -}}
{{- $repository := required "image.repository: no specroute image is published; build it (docker build --target gateway -t REGISTRY/specroute:TAG .), push it to a registry the cluster pulls from, and set image.repository (and image.tag): docs/deployment.md, \"The image\"" .Values.image.repository -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
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
