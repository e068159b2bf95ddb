{{- define "kms.labels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kms.socketDir" -}}
{{- trimSuffix "/" .Values.socketDir -}}
{{- end -}}

{{/* Whether /metrics and /healthz listen on loopback only. */}}
{{- define "kms.httpOnLoopback" -}}
{{- $a := toString .Values.httpEndpoint.address -}}
{{- or (hasPrefix "127." $a) (eq $a "::1") (eq $a "[::1]") (eq $a "localhost") -}}
{{- end }}
