{{/*
Labels of every object's metadata: Helm's, and extraLabels. Selectors and
pod labels are deploy/'s (`app: <name>`) and never change with a release.
*/}}
{{- define "manila-csi.labels" -}}
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
pods by them (NetworkPolicies, PodDisruptionBudgets, log and alert
selectors) finds ours. Upstream's `app` value (the chart's name) cannot be
added: `app` is the selectors'.
Called with (dict "component" NAME "root" $).
*/}}
{{- define "manila-csi.podLabels" -}}
component: {{ .component }}
release: {{ .root.Release.Name }}
chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
heritage: {{ .root.Release.Service }}
{{- with .root.Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
What each protocol this plugin serves needs: its ports (each its own:
every pod can share a node's host network) and its node plugin's
resources. A protocol it does not serve fails the rendering.
*/}}
{{- define "manila-csi.protocol" -}}
{{- $known := dict
  "NFS" (dict "controllerHealthz" 9812 "controllerMetrics" 9832 "nodeHealthz" 9811 "nodeMetrics" 9831 "preStop" 9851 "registrarHealthz" 9871
              "nodeLimit" "64Mi" "nodeLimitWhy" "the plugin alone: mount.nfs exits after mounting")
  "CEPHFS" (dict "controllerHealthz" 9813 "controllerMetrics" 9833 "nodeHealthz" 9810 "nodeMetrics" 9830 "preStop" 9850 "registrarHealthz" 9870
              "nodeLimit" "128Mi" "nodeLimitWhy" "the plugin alone: the ceph-fuse daemons live in mount pods")
-}}
{{- $p := upper .protocolSelector -}}
{{- if not (hasKey $known $p) -}}
{{- fail (printf "shareProtocols: protocolSelector %q is not served (NFS or CEPHFS)" .protocolSelector) -}}
{{- end -}}
{{- toJson (get $known $p) -}}
{{- end -}}

{{/* A protocol's driver name: <protocol>.<driverName>, lower case. */}}
{{- define "manila-csi.driver" -}}
{{- printf "%s.%s" .protocol.protocolSelector .root.Values.driverName | lower -}}
{{- end -}}

{{/* The drivers' startup taints, comma-separated. */}}
{{- define "manila-csi.startupTaints" -}}
{{- $taints := list -}}
{{- range .Values.shareProtocols -}}
{{- $taints = append $taints (printf "%s/agent-not-ready" (include "manila-csi.driver" (dict "protocol" . "root" $))) -}}
{{- end -}}
{{- join "," $taints -}}
{{- end -}}

{{/* Non-empty when the CephFS node plugin runs mount pods. */}}
{{- define "manila-csi.mountPods" -}}
{{- if .Values.nodeplugin.mountPods.enabled -}}
{{- range .Values.shareProtocols -}}
{{- if eq (upper .protocolSelector) "CEPHFS" }}true{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "manila-csi.kubeletDir" -}}
{{- trimSuffix "/" .Values.nodeplugin.kubeletDir -}}
{{- end -}}

{{- define "manila-csi.pluginImageRef" -}}
{{- printf "%s:%s" .Values.csimanila.image.repository (toString (default .Chart.AppVersion .Values.csimanila.image.tag)) -}}
{{- end -}}

{{- define "manila-csi.pluginImage" -}}
image: {{ include "manila-csi.pluginImageRef" . | quote }}
{{- with .Values.csimanila.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{- define "manila-csi.image" -}}
image: {{ printf "%s:%s" .repository (toString .tag) | quote }}
{{- with .pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The plugins' own log level, from the sidecars' klog verbosity. */}}
{{- define "manila-csi.logLevel" -}}
{{- $v := int .Values.logVerbosityLevel -}}
{{- if ge $v 6 }}
- --log-level=trace
{{- else if ge $v 4 }}
- --log-level=debug
{{- end -}}
{{- end -}}

{{/*
A sidecar of a controller: (dict "name" NAME "values" VALUES "args" ARGS
"securityContext" CONTEXT "root" $), talking to the plugin on /csi/csi.sock.
*/}}
{{- define "manila-csi.sidecar" -}}
- name: {{ .name }}
  {{- include "manila-csi.image" .values.image | nindent 2 }}
  args:
    - {{ printf "-v=%v" .root.Values.logVerbosityLevel }}
    {{- range .args }}
    - {{ . }}
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

{{/* The plugin container's liveness probe. */}}
{{- define "manila-csi.livenessProbe" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: healthz
  initialDelaySeconds: {{ .Values.livenessprobe.initialDelaySeconds }}
  timeoutSeconds: {{ .Values.livenessprobe.timeoutSeconds }}
  periodSeconds: {{ .Values.livenessprobe.periodSeconds }}
  failureThreshold: {{ .Values.livenessprobe.failureThreshold }}
{{- end -}}

{{/*
Extra arguments: a YAML list as a string (through `tpl`), a list, or a map
of flag to value. Called with (list VALUE $).
*/}}
{{- define "manila-csi.extraArgs" -}}
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

{{/*
Whether a sidecar's image tag is at least a version (the flags of an older
sidecar, pinned by a values file written for upstream's chart, must not
include one it does not know). A tag that is not a version (a digest,
"latest") counts as new. Called with (list TAG ">=6.3.0-0").
*/}}
{{- define "manila-csi.tagAtLeast" -}}
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
{{- define "manila-csi.digits" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{ int64 . }}
{{- else -}}
{{ . }}
{{- end -}}
{{- end -}}
