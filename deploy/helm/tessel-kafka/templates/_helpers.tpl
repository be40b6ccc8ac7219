{{/* The resources' name: the release name, or <release>-<chart> when it lacks the chart name. */}}
{{- define "tessel-kafka.fullname" -}}
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

{{- define "tessel-kafka.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the pods; never change them in an upgrade (selectors are immutable). */}}
{{- define "tessel-kafka.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessel-kafka.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessel-kafka.labels" -}}
{{ include "tessel-kafka.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tessel
{{- end -}}

{{- define "tessel-kafka.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tessel-kafka.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tessel-kafka.secretName" -}}
{{- default (include "tessel-kafka.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* config.toml as mounted: the `config` value through tpl. */}}
{{- define "tessel-kafka.config" -}}
{{- tpl .Values.config . -}}
{{- end -}}

{{- define "tessel-kafka.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
