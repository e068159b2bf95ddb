{{/*
Labels of every object's metadata: Helm's, and extraLabels. Selectors and
pod labels are deploy/'s (`app: <name>`) and never change with a release.
*/}}
{{- define "cinder-csi.labels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Pod labels of upstream's chart beside deploy/'s `app` (the selectors',
which an installed workload cannot change): its `component`, `release`,
`chart` and `heritage`, and extraLabels, so that what selects upstream's
pods by them (NetworkPolicies, PodDisruptionBudgets, a PodMonitor's job
label, log and alert selectors) finds ours. Upstream's `app` value
(the chart's name) cannot be added: `app` is the selectors'.
Called with (dict "component" NAME "root" $).
*/}}
{{- define "cinder-csi.podLabels" -}}
component: {{ .component }}
release: {{ .root.Release.Name }}
chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
heritage: {{ .root.Release.Service }}
{{- with .root.Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Extra arguments in any of the forms upstream's values take: a YAML list as
a string (upstream's, through `tpl`), a list, or a map of flag to value.
Called with (list VALUE $).
*/}}
{{- define "cinder-csi.extraArgs" -}}
{{- $args := index . 0 -}}
{{- $root := index . 1 -}}
{{- if kindIs "string" $args -}}
{{ tpl $args $root | trim }}
{{- else if kindIs "slice" $args -}}
{{- range $args }}
- {{ tpl (toString .) $root | quote }}
{{- end }}
{{- else if kindIs "map" $args -}}
{{- range $flag, $value := $args }}
- {{ printf "--%s=%v" (trimPrefix "--" $flag) $value | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* A container's image and pull policy, from an image block. */}}
{{- define "cinder-csi.image" -}}
image: {{ printf "%s:%s" .repository (toString .tag) | quote }}
{{- with .pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The plugins' own log level, from the sidecars' klog verbosity. */}}
{{- define "cinder-csi.logLevel" -}}
{{- $v := int .Values.logVerbosityLevel -}}
{{- if ge $v 6 }}
- --log-level=trace
{{- else if ge $v 4 }}
- --log-level=debug
{{- end -}}
{{- end -}}

{{/* The plugin image's tag. */}}
{{- define "cinder-csi.pluginImage" -}}
{{- $image := deepCopy .Values.csi.plugin.image -}}
{{- $_ := set $image "tag" (default .Chart.AppVersion $image.tag) -}}
{{ include "cinder-csi.image" $image }}
{{- end -}}

{{/* The cloud.conf volume of the controller (upstream's four ways). */}}
{{- define "cinder-csi.cloudConfigVolume" -}}
{{- if .Values.secret.enabled }}
- name: cloud-config
  secret:
    secretName: {{ required "secret.name: the Secret holding cloud.conf" .Values.secret.name }}
{{- else if .Values.secret.hostMount }}
- name: cloud-config
  hostPath:
    path: /etc/config
{{- end }}
{{- end -}}

{{/* The node plugins' own Secret: secret.nodeName; with secret.create and
no nodeName, the one this chart derives from secret.data without its
credentials (they call no OpenStack API); none otherwise (they then read
the controller's, as upstream's do). */}}
{{- define "cinder-csi.nodeSecretName" -}}
{{- if .Values.secret.enabled -}}
{{- if .Values.secret.nodeName -}}
{{ .Values.secret.nodeName }}
{{- else if .Values.secret.create -}}
{{ printf "%s-node" (required "secret.name: the Secret to make" .Values.secret.name) }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The node plugins': their own Secret when there is one, else the controller's. */}}
{{- define "cinder-csi.nodeCloudConfigVolume" -}}
{{- with include "cinder-csi.nodeSecretName" . }}
- name: cloud-config
  secret:
    secretName: {{ . }}
{{- else }}
{{- include "cinder-csi.cloudConfigVolume" . }}
{{- end }}
{{- end -}}

{{/* The plugin container's resources in a pod (list $ POD-DEFAULTS). */}}
{{- define "cinder-csi.pluginResources" -}}
{{- $root := index . 0 -}}
{{- $own := index . 1 -}}
{{- $resources := $root.Values.csi.plugin.resources | default $own -}}
{{- with $resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
A sidecar of the plugin: (dict "name" NAME "values" .Values.csi.<sidecar>
"args" ARGS "securityContext" CONTEXT "root" $), talking to the plugin on
/csi/csi.sock.
*/}}
{{- define "cinder-csi.sidecar" -}}
- name: {{ .name }}
  {{- include "cinder-csi.image" .values.image | nindent 2 }}
  args:
    - {{ printf "-v=%v" .root.Values.logVerbosityLevel }}
    {{- range .args }}
    - {{ . }}
    {{- end }}
    {{- with include "cinder-csi.extraArgs" (list .values.extraArgs .root) }}
    {{- . | nindent 4 }}
    {{- end }}
  {{- with .values.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: socket-dir
      mountPath: /csi
{{- end -}}

{{/* The plugin container's liveness probe (upstream's values). */}}
{{- define "cinder-csi.livenessProbe" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: healthz
  initialDelaySeconds: {{ .Values.csi.livenessprobe.initialDelaySeconds }}
  timeoutSeconds: {{ .Values.csi.livenessprobe.timeoutSeconds }}
  periodSeconds: {{ .Values.csi.livenessprobe.periodSeconds }}
  failureThreshold: {{ .Values.csi.livenessprobe.failureThreshold }}
{{- end -}}

{{/*
Whether a sidecar's image tag is at least a version (the flags of an older
sidecar, pinned by a values file written for upstream's chart, must not
include one it does not know). A tag that is not a version (a digest,
"latest") counts as new. Called with (list TAG ">=6.3.0-0").
*/}}
{{- define "cinder-csi.tagAtLeast" -}}
{{- $tag := toString (index . 0) -}}
{{- if regexMatch "^v?[0-9]+[.][0-9]+[.][0-9]+" $tag -}}
{{- if semverCompare (index . 1) (regexFind "^v?[0-9]+[.][0-9]+[.][0-9]+" $tag) }}true{{ end -}}
{{- else -}}
true
{{- end -}}
{{- end -}}

{{/* A value that may be a number as Helm read it: a whole number from a
values file comes as a float64, which Go prints with an exponent from a
million on ("1.2345678e+07"); its digits instead. */}}
{{- define "cinder-csi.digits" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{ int64 . }}
{{- else -}}
{{ . }}
{{- end -}}
{{- end -}}
