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

{{/*
The label the monitoring objects take the Prometheus job from (their jobLabel), on the Service
and the pods. Its value is fixed, whatever the release, nameOverride or fullnameOverride: the
shipped alert rules and dashboard select job="tessel-kafka".
*/}}
{{- define "tessel-kafka.jobLabel" -}}
tessel.dev/job
{{- end -}}

{{- define "tessel-kafka.job" -}}
tessel-kafka
{{- end -}}

{{- define "tessel-kafka.labels" -}}
{{ include "tessel-kafka.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tessel
{{ include "tessel-kafka.jobLabel" . }}: {{ include "tessel-kafka.job" . }}
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

{{/* Whether the chart makes the Secret ("true" or empty). */}}
{{- define "tessel-kafka.createsSecret" -}}
{{- if and .Values.secrets.create (not .Values.secrets.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* config.toml as mounted: the `config` value through tpl. */}}
{{- define "tessel-kafka.config" -}}
{{- tpl .Values.config . -}}
{{- end -}}

{{/*
The config as data (JSON of the parsed TOML), for what the chart derives from it: whether it
places connections through a region cluster, and which settings only a restart applies. Use:
  $cfg := include "tessel-kafka.settings" . | fromJson
*/}}
{{- define "tessel-kafka.settings" -}}
{{- $cfg := include "tessel-kafka.config" . | fromToml -}}
{{- if hasKey $cfg "Error" -}}
{{- fail (printf "config: not valid TOML: %s" $cfg.Error) -}}
{{- end -}}
{{- toJson $cfg -}}
{{- end -}}

{{/* "true" when the config places connections through a region cluster ([region.kafka]). */}}
{{- define "tessel-kafka.placement" -}}
{{- $cfg := include "tessel-kafka.settings" . | fromJson -}}
{{- if dig "region" "kafka" "" $cfg -}}true{{- end -}}
{{- end -}}

{{/*
Values that no longer exist, and combinations that cannot work: refused at render time, so an
upgrade with old values fails with the reason instead of rendering something else.
*/}}
{{- define "tessel-kafka.validate" -}}
{{- if hasKey .Values.staticMembership "connections" -}}
{{- fail "staticMembership.connections was removed: static membership now applies to every consuming connection (staticMembership.enabled); remove the list" -}}
{{- end -}}
{{- if hasKey .Values.keda "connection" -}}
{{- fail "keda.connection was removed: KEDA scales on the load of every connection of the release; remove it" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled: choose one, or every pod is scraped twice" -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$" (toString .Values.region)) -}}
{{- fail (printf "region %q: use letters, digits, '.', '_' and '-' (it is a pod label and names the region's Kafka groups)" (toString .Values.region)) -}}
{{- end -}}
{{- $cfg := include "tessel-kafka.settings" . | fromJson -}}
{{- range $connection, $c := (get $cfg "connections" | default dict) -}}
{{- if hasKey (get $c "kafka" | default dict) "group.instance.id" -}}
{{- fail (printf "config: connection %s sets group.instance.id: every pod would join with the same one, and Kafka fences all but one; remove it (staticMembership.enabled gives each pod its own)" $connection) -}}
{{- end -}}
{{- end -}}
{{- $name := dig "region" "name" "" $cfg -}}
{{- if and $name (ne $name (toString .Values.region)) -}}
{{- fail (printf "config sets region.name %q but the chart's region is %q: the chart sets region.name from `region`; remove it from the config or make them equal" $name (toString .Values.region)) -}}
{{- end -}}
{{- end -}}

{{- define "tessel-kafka.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The pod's volumes of the config and the secrets (the workload's and the test's). */}}
{{- define "tessel-kafka.configVolumes" -}}
- name: config
  configMap: {name: {{ include "tessel-kafka.fullname" . }}}
- name: secrets
  secret: {secretName: {{ include "tessel-kafka.secretName" . }}}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- end -}}

{{- define "tessel-kafka.configMounts" -}}
- {name: config, mountPath: /etc/tessel-kafka, readOnly: true}
- {name: secrets, mountPath: {{ .Values.secrets.mountPath }}, readOnly: true}
# The only writable path (the root filesystem is read-only).
- {name: tmp, mountPath: /tmp}
{{- end -}}
