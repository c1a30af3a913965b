{{/*
Names are fixed, not derived from the release: the CRDs, the webhook configuration
`stateward.io` and the leader Lease are cluster-wide singletons, so one Stateward runs per
cluster, and the objects are the ones `make deploy` (config/) creates.
*/}}

{{- define "stateward.selectorLabels" -}}
app.kubernetes.io/name: stateward
app.kubernetes.io/component: operator
{{- end }}

{{- define "stateward.labels" -}}
{{ include "stateward.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "stateward.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}
