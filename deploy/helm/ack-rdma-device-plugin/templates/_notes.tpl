{{/*
The text of NOTES.txt, as a named template so it can be rendered for any set of served APIs
(helm install takes them from the cluster; tests give them to helm template).
*/}}
{{- define "rdma.notes" -}}
rdma-hca is installed as DaemonSet {{ include "rdma.dsName" . }} in {{ .Release.Namespace }}.
{{- if eq .Values.image.repository (include "rdma.unpublishedImage" .) }}

WARNING: image.repository is still {{ .Values.image.repository }}, the chart's placeholder:
no image is published there, so the plugin pods cannot pull it (ImagePullBackOff). Point it
at the image a release pushed (ghcr.io/<owner>/rdma-hca) or at your own build:
  helm upgrade {{ .Release.Name }} <chart> -n {{ .Release.Namespace }} --reuse-values --set image.repository=<registry>/rdma-hca
{{- end }}

1. Check that a pod runs on every RDMA node (DESIRED == READY):
     kubectl get ds {{ include "rdma.dsName" . }} -n {{ .Release.Namespace }}
{{- if .Values.affinity }}
   With the default affinity it runs only on nodes labelled by Node Feature Discovery
   (feature.node.kubernetes.io/rdma.available=true or rdma.capable=true) or by hand with
   rdma.hca/enabled=true:
     kubectl label node <node> rdma.hca/enabled=true
{{- end }}

{{- if include "rdma.devicePluginEnabled" . }}

2. Check that a node offers the resource ({{ include "rdma.resourceNamesText" . }} in capacity and allocatable):
     kubectl get node <node> -o yaml
{{- else }}

2. The device plugin is off (devicePlugin.enabled=false): nodes offer no {{ include "rdma.resourceNamesText" . }}
   of their own; it is served only through DRA where the cluster maps it (see below).
{{- end }}

3. Ask for it in a pod: resources.limits: {{ printf "{%s: 1}" (include "rdma.resourceNames" . | fromJsonArray | first) }}
{{- if .Values.nonHostNetwork.enabled }}
   Non-hostNetwork RDMA is ON: any pod may ask for it. This works only when the nodes' RDMA
   compute network is IPv6; on IPv4, RDMA does not work in pods without hostNetwork.
{{- else if include "rdma.admissionPolicyAvailable" . }}
   Only pods with spec.hostNetwork: true may ask for it; the admission policy
   {{ include "rdma.hostNetworkPolicyName" . }} refuses other pods and workloads at apply time.
{{- else }}
   Only pods with spec.hostNetwork: true can use it, but this cluster does not serve
   admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes < 1.30), so the
   chart installed NO admission policy: a pod without hostNetwork that asks for
   {{ include "rdma.resourceNamesText" . }} is scheduled and its RDMA fails at run time, and no warning
   names a container without IPC_LOCK. Upgrade the cluster to 1.30+ and run
   `helm upgrade --reuse-values` to get the policies.
{{- end }}
{{- if and .Values.nonHostNetwork.enabled (not (include "rdma.admissionPolicyAvailable" .)) }}
   No IPC_LOCK warning policy is installed: this cluster does not serve
   admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes < 1.30).
{{- end }}
{{- if .Values.dra.enabled }}

DRA is on (driver {{ .Values.dra.driverName }}): every node publishes its HCAs as a ResourceSlice,
     kubectl get resourceslices --field-selector spec.driver={{ .Values.dra.driverName }}
and ResourceClaims ask for them through the DeviceClass {{ .Values.dra.driverName }} (docs/dra.md).
{{- if .Values.dra.extendedResourceName }}
Pods asking for {{ .Values.dra.extendedResourceName }} in resources.limits are served by DRA through the
DeviceClass {{ .Values.dra.driverName }}-extended where DRAExtendedResource is on (beta in 1.36).
{{- if and (ne (toString .Values.dra.mode) "exclusive") (eq (toString .Values.dra.nodeDevice) "false") }}
dra.nodeDevice is false: each unit of {{ .Values.dra.extendedResourceName }} is one HCA, not every HCA of the node.
{{- end }}
{{- end }}
{{- if include "rdma.draNodeDevice" . }}
A DeviceClass of your own for this driver must select the kind too: written as DRA guides
show it (device.driver == "{{ .Values.dra.driverName }}") it also matches the node-wide device all-hcas, so a
claim for one HCA may get every HCA of the node, and a selector on an attribute only an HCA
has (netdev, pcieRoot, nodeGUID) fails the allocation ("CEL runtime error: no such key"). Add
  && device.attributes["{{ .Values.dra.driverName }}"].kind == "hca"
(the chart's DeviceClass {{ .Values.dra.driverName }} already keeps all-hcas out; docs/dra.md).
{{- end }}
Drain a node before it moves from the device plugin to DRA (docs/dra.md).
{{- end }}
{{- if and .Values.metrics.enabled .Values.metrics.podMonitor.enabled (not (include "rdma.podMonitorAvailable" .)) }}

NOTE: metrics.podMonitor.enabled is set but this cluster does not serve
monitoring.coreos.com/v1 PodMonitor (no Prometheus Operator): no PodMonitor was installed.
{{- end }}
{{- if and .Values.metrics.enabled .Values.metrics.prometheusRule.enabled (not (include "rdma.prometheusRuleAvailable" .)) }}

NOTE: metrics.prometheusRule.enabled is set but this cluster does not serve
monitoring.coreos.com/v1 PrometheusRule (no Prometheus Operator): no alerts were installed.
{{- end }}

When something does not work: rdma-hca doctor (cluster view, from your workstation), and on
a node: kubectl -n {{ .Release.Namespace }} exec <plugin pod> -- rdma-hca doctor --node
{{- end -}}
