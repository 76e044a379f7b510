{{/* Name of the chart, overridable. */}}
{{- define "gpuaas-dra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name every object starts with. */}}
{{- define "gpuaas-dra.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuaas-dra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuaas-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpuaas-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuaas-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuaas-dra.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "gpuaas-dra.pluginName" -}}
{{ include "gpuaas-dra.fullname" . | trunc 50 | trimSuffix "-" }}-kubelet-plugin
{{- end -}}

{{- define "gpuaas-dra.controllerName" -}}
{{ include "gpuaas-dra.fullname" . | trunc 52 | trimSuffix "-" }}-controller
{{- end -}}

{{/* The webhook's serving-certificate Secret, written by the controller. */}}
{{- define "gpuaas-dra.webhookSecret" -}}
{{ include "gpuaas-dra.controllerName" . }}-webhook-tls
{{- end -}}

{{/* The webhook configuration the controller maintains (cluster-scoped). */}}
{{- define "gpuaas-dra.webhookConfig" -}}
{{ include "gpuaas-dra.fullname" . }}-quota
{{- end -}}

{{/* The controller's PriorityClass: the value's, else the chart's own. */}}
{{- define "gpuaas-dra.controllerPriorityClass" -}}
{{ .Values.controller.priorityClassName | default (include "gpuaas-dra.controllerName" .) }}
{{- end -}}

{{/* The claim webhooks' matchCondition for the classes in .classes, the
  ResourceClaimSpec at .spec ("object.spec", "object.spec.spec"): the same
  expression, byte for byte, as pkg/controller/webhook's foreignCondition
  (test/chart compares them). */}}
{{- define "gpuaas-dra.foreignExpression" -}}
{{- $names := list }}
{{- range .classes }}{{ $names = append $names (quote .) }}{{ end }}
{{- $fields := splitList "." (printf "%s.devices.requests" (trimPrefix "object." .spec)) }}
{{- $path := "object" }}
{{- $guards := list }}
{{- range $i, $f := $fields }}
{{- $path = printf "%s.%s" $path $f }}
{{- $kind := ternary "list" "map" (eq (add1 $i) (len $fields)) }}
{{- $guards = append $guards (printf "has(%s) && type(%s) == %s" $path $path $kind) }}
{{- end }}
{{- $classes := "(has(r.exactly) && type(r.exactly) == map ? [r.exactly] :\n      has(r.firstAvailable) && type(r.firstAvailable) == list ? r.firstAvailable : [])" }}
{{- printf "!(%s &&\n  size(%s) > 0 && %s.all(r, type(r) == map &&\n    size(%s) > 0 &&\n    %s.all(s, type(s) == map &&\n      has(s.deviceClassName) && type(s.deviceClassName) == string &&\n      s.deviceClassName in [%s])))" (join " &&\n  " $guards) $path $path $classes $classes (join ", " $names) }}
{{- end -}}
