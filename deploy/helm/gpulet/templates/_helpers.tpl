{{/*
Object names are fixed (gpulet-node, gpulet-scheduler, ...), as in the kustomize tree: cluster-wide
objects (ClusterRoles, the webhook, the admission policies) and the CEL that names the agent's
service account refer to them, so one release per cluster.
*/}}

{{/* Labels helm adds to every object's metadata (not to selectors or pod templates). */}}
{{- define "gpulet.releaseLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "gpulet.image" -}}
{{- $tag := .Values.image.tag | toString | default .Chart.AppVersion -}}
{{- if .Values.image.registry -}}
{{ printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag }}
{{- else -}}
{{ printf "%s:%s" .Values.image.repository $tag }}
{{- end -}}
{{- end }}

{{/* image, and imagePullPolicy when one is given; indented by the caller. */}}
{{- define "gpulet.imageFields" -}}
image: {{ include "gpulet.image" . }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* imagePullSecrets, or nothing; callers: with (include ...) | nindent. */}}
{{- define "gpulet.pullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end }}

{{/* Per-node configs: named configs from a ConfigMap, picked by a node label. */}}
{{- define "gpulet.perNodeConfig" -}}
{{- if or .Values.config.name .Values.config.map }}true{{ end -}}
{{- end }}

{{- define "gpulet.configMapName" -}}
{{- if .Values.config.name }}{{ .Values.config.name }}{{ else }}gpulet-device-plugin-configs{{ end -}}
{{- end }}

{{- define "gpulet.selfIssued" -}}
{{- if eq .Values.certificates.source "self-issued" }}true{{ end -}}
{{- end }}

{{/* A map of strings, each value quoted: `--set nodeSelector.gpu=true` gives "true", not a bool
the API would refuse. */}}
{{- define "gpulet.stringMap" -}}
{{- range $k, $v := . }}
{{ $k | quote }}: {{ $v | toString | quote }}
{{- end }}
{{- end }}
