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

{{/*
values.yaml's image.repository: a placeholder where no image is published; the notes warn
while it is still set (a test holds values.yaml to it).
*/}}
{{- define "rdma.unpublishedImage" -}}ghcr.io/rdma-hca/rdma-hca{{- end -}}

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
"true" when the DRA driver publishes the node-wide device all-hcas: shared mode with
dra.nodeDevice not false (values reused from a chart without the key mean it, as before).
*/}}
{{- define "rdma.draNodeDevice" -}}
{{- if and (ne (toString .Values.dra.mode) "exclusive") (ne (toString .Values.dra.nodeDevice) "false") -}}true{{- end -}}
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
{{- /* A pool without selectors of its own has the top-level ones. */ -}}
{{- $takesAll := not .Values.selectors -}}
{{- if .Values.pools -}}
{{- $takesAll = false -}}
{{- range .Values.pools -}}
{{- if not (.selectors | default $.Values.selectors) -}}{{- $takesAll = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $dpOn .Values.dra.enabled (or $takesAll (not .Values.dra.selectors)) -}}
{{- fail "dra.enabled=true with devicePlugin.enabled=true: the device plugin pool (selectors) and the DRA driver (dra.selectors) would both offer every HCA; set devicePlugin.enabled=false to run DRA alone, or give selectors and dra.selectors different HCAs (e.g. selectors.names={mlx5_0,mlx5_1} and dra.selectors.names={mlx5_2,mlx5_3})" -}}
{{- end -}}
{{- end -}}

{{/*
The schema checks the shape of resourceName; these are the kubelet's other rules for an
extended resource name, which a JSON schema pattern cannot say clearly.
*/}}
{{- define "rdma.checkResourceName" -}}
{{- $seen := dict -}}
{{- range $i, $name := include "rdma.resourceNames" . | fromJsonArray -}}
{{- $key := ternary (printf "pools[%d].resourceName" $i) "resourceName" (gt (len $.Values.pools) 0) -}}
{{- if contains "kubernetes.io/" $name -}}
{{- fail (printf "%s %q: the kubernetes.io domain is reserved for built-in resources; use your own domain, e.g. rdma/hca or example.com/rdma" $key $name) -}}
{{- end -}}
{{- if hasPrefix "requests." $name -}}
{{- fail (printf "%s %q: names starting with \"requests.\" are reserved for quotas; use e.g. rdma/hca" $key $name) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "%s %q: another pool has that name already; each pool needs its own resourceName" $key $name) -}}
{{- end -}}
{{- $_ := set $seen $name true -}}
{{- end -}}
{{- end -}}

{{/*
An exclusive pool hands each HCA to one pod: beside a pool that takes every HCA (no
selectors of its own and none at the top level) it would share its HCAs. The daemon refuses
that too, naming the HCA; here the install fails before any pod starts. Overlaps that only
the node can show are left to the daemon.
*/}}
{{- define "rdma.checkPools" -}}
{{- range $i, $ex := .Values.pools -}}
{{- if eq ($ex.mode | default $.Values.mode) "exclusive" -}}
{{- range $j, $other := $.Values.pools -}}
{{- if ne $i $j -}}
{{- $whole := "" -}}
{{- $exSel := $ex.selectors | default $.Values.selectors | default dict -}}
{{- $otherSel := $other.selectors | default $.Values.selectors | default dict -}}
{{- /* What both hold: the names of the pool that does not take every HCA. */ -}}
{{- $named := list -}}
{{- if not $exSel -}}{{- $whole = $ex.resourceName -}}{{- $named = $otherSel.names | default list -}}{{- end -}}
{{- if not $otherSel -}}{{- $whole = $other.resourceName -}}{{- $named = $exSel.names | default list -}}{{- end -}}
{{- if $whole -}}
{{- $held := "every HCA" -}}
{{- if $named -}}{{- $held = printf "%s %s" (ternary "the HCA" "the HCAs" (eq (len $named) 1)) (join ", " $named) -}}{{- end -}}
{{- fail (printf "pools[%d]: the exclusive pool %s and the pool %s would both hold %s (%s takes every HCA: it has no selectors, nor does the top level): an exclusive pool gives each HCA to one pod only; give the pools selectors that keep their HCAs apart" $i $ex.resourceName $other.resourceName $held $whole) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The resource names pods ask for, as a JSON list: every pool's, or resourceName's. */}}
{{- define "rdma.resourceNames" -}}
{{- $names := list -}}
{{- range .Values.pools -}}{{- $names = append $names .resourceName -}}{{- end -}}
{{- if not $names -}}{{- $names = list .Values.resourceName -}}{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The first of them (resourceName without pools) as a CEL string literal. */}}
{{- define "rdma.celResourceName" -}}
{{- printf "'%s'" (include "rdma.resourceNames" . | fromJsonArray | first) -}}
{{- end -}}

{{/* The same names for people: "rdma/hca" or "rdma/a, rdma/b". */}}
{{- define "rdma.resourceNamesText" -}}
{{- include "rdma.resourceNames" . | fromJsonArray | join ", " -}}
{{- end -}}

{{/* The resource names as a CEL list of string literals; the schema's pattern keeps quotes
out of them. */}}
{{- define "rdma.celResourceNames" -}}
{{- $quoted := list -}}
{{- range include "rdma.resourceNames" . | fromJsonArray -}}{{- $quoted = append $quoted (printf "'%s'" .) -}}{{- end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{/*
The daemon's config file. Rendered once here so the ConfigMap and the pod's checksum
annotation are computed from the same text.
*/}}
{{- define "rdma.config" -}}
{{- if .Values.pools }}
{{- /* Each pool written out whole, the top-level pool values filling what it leaves out (its
selectors replace the top-level ones, as the daemon reads them): no top-level default is
left for the daemon to warn about. */ -}}
pools:
{{- range .Values.pools }}
{{- $pool := merge (omit . "selectors") (dict "rdmaHcaMax" $.Values.rdmaHcaMax "mode" $.Values.mode "unhealthyWhen" $.Values.unhealthyWhen) }}
{{- $_ := set $pool "selectors" (.selectors | default $.Values.selectors | default dict) }}
  - {{- toYaml $pool | nindent 4 }}
{{- end }}
{{- else -}}
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
{{- end }}
nonHostNetwork: {{ .Values.nonHostNetwork.enabled }}
flapHoldSeconds: {{ .Values.flapHoldSeconds }}
ncclEnv: {{ .Values.ncclEnv | toJson }}
metricsAddress: {{ ternary (include "rdma.metricsAddress" .) "" .Values.metrics.enabled | quote }}
logFormat: {{ .Values.logFormat }}
logLevel: {{ .Values.logLevel }}
{{- if (.Values.fabric | default dict).lldp }}
fabric:
  lldp: {{ .Values.fabric.lldp }}
{{- end }}
cdi:
  enabled: {{ .Values.cdi.enabled }}
  specDir: {{ .Values.cdi.specDir | quote }}
{{- if .Values.dra.enabled }}
dra:
  mode: {{ .Values.dra.mode }}
  deviceMetadata: {{ .Values.dra.deviceMetadata | toJson }}
  nodeDevice: {{ ne (toString .Values.dra.nodeDevice) "false" }}
  defaultBandwidth: {{ .Values.dra.defaultBandwidth | default "0" | quote }}
  apiQps: {{ .Values.dra.apiQps }}
  apiBurst: {{ .Values.dra.apiBurst }}
  claimApiQps: {{ .Values.dra.claimApiQps }}
  claimApiBurst: {{ .Values.dra.claimApiBurst }}
  resyncSeconds: {{ .Values.dra.resyncSeconds }}
  startJitterSeconds: {{ .Values.dra.startJitterSeconds }}
  statusRetryAfterMaxSeconds: {{ .Values.dra.statusRetryAfterMaxSeconds | default 60 }}
  {{- if .Values.dra.selectors }}
  selectors:
    {{- toYaml .Values.dra.selectors | nindent 4 }}
  {{- else }}
  selectors: {}
  {{- end }}
{{- end }}
{{- end -}}
