{{/* The release's full name, at most 63 characters. */}}
{{- define "argosy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "argosy.selectorLabels" -}}
app.kubernetes.io/name: argosy-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "argosy.labels" -}}
{{ include "argosy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: argosy
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "argosy.agentSelectorLabels" -}}
app.kubernetes.io/name: argosy-model-cache-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "argosy.agentLabels" -}}
{{ include "argosy.agentSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: argosy
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "argosy.serviceAccountName" -}}
{{- default (include "argosy.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "argosy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The operator's own permissions (operator/rbac.py RULES, ADMISSION_RULES and ROUTER_RULES; a test keeps them
equal). */}}
{{- define "argosy.operatorRules" -}}
- apiGroups: ["argosy.dev"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["argosy.dev"]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
- apiGroups: ["argosy.dev"]
  resources: ["modelcaches"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["argosy.dev"]
  resources: ["modelcaches/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["argosy.dev"]
  resources: ["inferenceservices/finalizers"]
  verbs: ["update"]
{{- end -}}

{{/* kopf's namespaced peering (rbac.py PEERING_RULES). */}}
{{- define "argosy.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}

{{/* What kopf needs cluster-wide in either scope (rbac.py CLUSTER_RULES), and the nodes a
ModelCache selects (rbac.py NODE_RULES). */}}
{{- define "argosy.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}

{{/*
The monitor of the inference pods the operator runs, as a PodMonitor or a ServiceMonitor
(they differ in kind and in the endpoints key). Either way each scraped target carries the
`namespace` and `pod` labels that the ScaledObjects' queries select by. With router true, the
monitor of the routers it runs (spec.routing.router) instead, on their `metrics` port.
Takes: root (the chart's context), values (its metrics.*Monitor block), kind, endpointsKey, router.
*/}}
{{- define "argosy.inferenceMonitor" -}}
{{- $values := .values -}}
apiVersion: monitoring.coreos.com/v1
kind: {{ .kind }}
metadata:
  name: {{ include "argosy.fullname" .root }}-{{ if .router }}router{{ else }}inference{{ end }}
  namespace: {{ default .root.Release.Namespace $values.namespace }}
  labels:
    {{- include "argosy.labels" .root | nindent 4 }}
    {{- with $values.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ if .router }}argosy-router{{ else }}argosy{{ end }}
      app.kubernetes.io/managed-by: argosy-operator
  namespaceSelector:
    {{- if .root.Values.operator.namespaces }}
    matchNames:
      {{- toYaml .root.Values.operator.namespaces | nindent 6 }}
    {{- else }}
    any: true
    {{- end }}
  {{ .endpointsKey }}:
    - port: {{ if .router }}metrics{{ else }}http{{ end }}
      path: /metrics
      interval: {{ $values.interval }}
{{- end -}}
