{{/* The release's name prefix of every object. */}}
{{- define "fcd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fcd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fcd.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The fcd image: repository:tag, or repository@digest. */}}
{{- define "fcd.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* A pod that runs as a user other than root, with no privilege to gain. */}}
{{- define "fcd.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "fcd.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The etcd endpoints authzd uses. */}}
{{- define "fcd.etcdEndpoints" -}}
{{- if eq .Values.etcd.mode "bundled" -}}
{{- $fullname := include "fcd.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "http://%s-etcd-%d.%s-etcd.%s.svc:2379" $fullname $i $fullname $ns) -}}
{{- end -}}
{{- toJson $eps -}}
{{- else if eq .Values.etcd.mode "external" -}}
{{- if not .Values.etcd.external.endpoints -}}
{{- fail "etcd.mode external needs etcd.external.endpoints" -}}
{{- end -}}
{{- toJson .Values.etcd.external.endpoints -}}
{{- else -}}
{{- fail "etcd.mode must be bundled or external" -}}
{{- end -}}
{{- end -}}
