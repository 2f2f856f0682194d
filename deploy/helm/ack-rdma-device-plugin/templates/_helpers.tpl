{{/*
Names are fixed, not derived from the release: the provider's guide and its users look for
the DaemonSet `ack-rdma-dp-ds` in kube-system, and the admission policies are cluster-wide.
*/}}
{{- define "rdma.dsName" -}}ack-rdma-dp-ds{{- end -}}
{{- define "rdma.configName" -}}ack-rdma-dp-config{{- end -}}
{{- define "rdma.saName" -}}ack-rdma-dp{{- end -}}
{{- define "rdma.hostNetworkPolicyName" -}}ack-rdma-dp-require-hostnetwork{{- end -}}
{{- define "rdma.ipcLockPolicyName" -}}ack-rdma-dp-warn-ipc-lock{{- end -}}

{{- define "rdma.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels never change after install (a DaemonSet's selector is immutable). */}}
{{/* HOST:PORT the daemon listens on; an IPv6 bindAddress gets its brackets here. */}}
{{- define "rdma.metricsAddress" -}}
{{- $host := .Values.metrics.bindAddress -}}
{{- if and (contains ":" $host) (not (hasPrefix "[" $host)) -}}
{{- $host = printf "[%s]" $host -}}
{{- end -}}
{{- printf "%s:%d" $host (int .Values.metrics.port) -}}
{{- end -}}

{{- define "rdma.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{/* A digest, when given, pins the image whatever the tag says. */}}
{{- define "rdma.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Non-empty where the API server serves the admission policy kind (Kubernetes 1.30 on). Helm
fills .Capabilities.APIVersions from the cluster's discovery on install and upgrade; for
`helm template` pass --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy.
*/}}
{{- define "rdma.admissionPolicyAvailable" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}true{{- end -}}
{{- end -}}

{{/* Non-empty where the Prometheus Operator's CRDs (monitoring.coreos.com/v1) are served. */}}
{{- define "rdma.podMonitorAvailable" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor" -}}true{{- end -}}
{{- end -}}
{{- define "rdma.prometheusRuleAvailable" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule" -}}true{{- end -}}
{{- end -}}

{{/*
Two device plugins for one resource on a node fight over its registration, so installing
next to the provider's own ack-rdma-dp-ds (in kube-system, not managed by this release) must
stop. Takes a dict: "existing" (the DaemonSet as `lookup` returns it, empty when there is
none or under `helm template`), "release" and "namespace" (this release's name/namespace).
*/}}
{{- define "rdma.guardForeignDaemonSet" -}}
{{- $existing := .existing | default dict -}}
{{- if $existing -}}
{{- $annotations := (($existing.metadata | default dict).annotations) | default dict -}}
{{- $owner := index $annotations "meta.helm.sh/release-name" | default "" -}}
{{- $ownerNs := index $annotations "meta.helm.sh/release-namespace" | default "" -}}
{{- if not (and (eq $owner .release) (eq $ownerNs .namespace)) -}}
{{- fail "DaemonSet kube-system/ack-rdma-dp-ds exists and is not managed by this release (the provider's ack-rdma-device-plugin?): disable the provider's component first, see docs/install.md \"Replacing the provider's ack-rdma-device-plugin\"" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The kubelet's device-plugins directory, mounted at the same path inside the pod. */}}
{{- define "rdma.devicePluginsDir" -}}
{{- printf "%s/device-plugins" (include "rdma.kubeletRoot" .) -}}
{{- end -}}

{{/*
kubeletDir is the kubelet's root (the daemon's kubeletRoot); the DRA driver's directories
derive from it as the daemon derives them, and are mounted at the same paths inside the
pod: the kubelet dials the socket paths the driver reports, which are paths on the host.
*/}}
{{- define "rdma.kubeletRoot" -}}
{{- trimSuffix "/" .Values.kubeletDir -}}
{{- end -}}
{{- define "rdma.pluginsRegistryDir" -}}
{{- printf "%s/plugins_registry" (include "rdma.kubeletRoot" .) -}}
{{- end -}}
{{- define "rdma.pluginsDir" -}}
{{- printf "%s/plugins" (include "rdma.kubeletRoot" .) -}}
{{- end -}}

{{/*
"true" unless devicePlugin.enabled is false. Values reused from a chart without the key
(helm upgrade --reuse-values) mean the device plugin, as before.
*/}}
{{- define "rdma.devicePluginEnabled" -}}
{{- $dp := .Values.devicePlugin | default dict -}}
{{- if or (not (hasKey $dp "enabled")) $dp.enabled -}}true{{- end -}}
{{- end -}}

{{/*
The daemon refuses to start with nothing to offer, or with the device plugin pools and the
DRA driver both taking every HCA (the same HCA offered twice). Both are known here, so they
fail the install instead of every pod. Overlapping names are left to the daemon, which
says which HCA is taken twice.
*/}}
{{- define "rdma.checkDra" -}}
{{- if and .Values.dra.enabled (not (hasKey (.Values.devicePlugin | default dict) "enabled")) -}}
{{- fail "dra.enabled=true but devicePlugin.enabled is not set: values reused from an older chart (helm upgrade --reuse-values) lack it; add --set devicePlugin.enabled=false to run DRA alone (or true beside the device plugin), or upgrade with --reset-then-reuse-values" -}}
{{- end -}}
{{- $dpOn := include "rdma.devicePluginEnabled" . -}}
{{- if and (not $dpOn) (not .Values.dra.enabled) -}}
{{- fail "devicePlugin.enabled=false with dra.enabled=false: nothing would be offered; turn one of them on (devicePlugin.enabled=false is for running the DRA driver alone)" -}}
{{- end -}}
{{- if and $dpOn .Values.dra.enabled (or (not .Values.selectors) (not .Values.dra.selectors)) -}}
{{- fail "dra.enabled=true with devicePlugin.enabled=true: the device plugin pool (selectors) and the DRA driver (dra.selectors) would both offer every HCA; set devicePlugin.enabled=false to run DRA alone, or give selectors and dra.selectors different HCAs (e.g. selectors.names={mlx5_0,mlx5_1} and dra.selectors.names={mlx5_2,mlx5_3})" -}}
{{- end -}}
{{- end -}}

{{/*
The schema checks the shape of resourceName; these are the kubelet's other rules for an
extended resource name, which a JSON schema pattern cannot say clearly.
*/}}
{{- define "rdma.checkResourceName" -}}
{{- if contains "kubernetes.io/" .Values.resourceName -}}
{{- fail (printf "resourceName %q: the kubernetes.io domain is reserved for built-in resources; use your own domain, e.g. rdma/hca or example.com/rdma" .Values.resourceName) -}}
{{- end -}}
{{- if hasPrefix "requests." .Values.resourceName -}}
{{- fail (printf "resourceName %q: names starting with \"requests.\" are reserved for quotas; use e.g. rdma/hca" .Values.resourceName) -}}
{{- end -}}
{{- end -}}

{{/* The resource name as a CEL string literal; the schema's pattern keeps quotes out of it. */}}
{{- define "rdma.celResourceName" -}}
{{- printf "'%s'" .Values.resourceName -}}
{{- end -}}

{{/*
The daemon's config file. Rendered once here so the ConfigMap and the pod's checksum
annotation are computed from the same text.
*/}}
{{- define "rdma.config" -}}
resourceName: {{ .Values.resourceName | quote }}
rdmaHcaMax: {{ .Values.rdmaHcaMax }}
mode: {{ .Values.mode }}
unhealthyWhen: {{ .Values.unhealthyWhen }}
{{- if .Values.selectors }}
selectors:
  {{- toYaml .Values.selectors | nindent 2 }}
{{- else }}
selectors: {}
{{- end }}
nonHostNetwork: {{ .Values.nonHostNetwork.enabled }}
ncclEnv: {{ .Values.ncclEnv }}
metricsAddress: {{ ternary (include "rdma.metricsAddress" .) "" .Values.metrics.enabled | quote }}
logFormat: {{ .Values.logFormat }}
logLevel: {{ .Values.logLevel }}
cdi:
  enabled: {{ .Values.cdi.enabled }}
  specDir: {{ .Values.cdi.specDir | quote }}
{{- if .Values.dra.enabled }}
dra:
  {{- if .Values.dra.selectors }}
  selectors:
    {{- toYaml .Values.dra.selectors | nindent 4 }}
  {{- else }}
  selectors: {}
  {{- end }}
{{- end }}
{{- end -}}
