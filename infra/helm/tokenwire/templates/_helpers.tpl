{{- define "tokenwire.fullname" -}}
{{- printf "%s-tokenwire" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tokenwire.labels" -}}
app.kubernetes.io/name: tokenwire
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "edge") */}}
{{- define "tokenwire.selector" -}}
app.kubernetes.io/name: tokenwire
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tokenwire.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "tokenwire.fullname" .)) -}}
{{- end -}}

{{/* The environment every service shares, and its Redis login: (dict "root" $ "component" "edge") */}}
{{- define "tokenwire.env" -}}
- name: TW_KAFKA_BOOTSTRAP
  value: {{ .root.Values.kafka.bootstrap | quote }}
- name: TW_REDIS_URL
  value: {{ .root.Values.redis.url | quote }}
- name: TW_TOPIC_PREFIX
  value: {{ .root.Values.topicPrefix | quote }}
- name: TW_REDIS_USERNAME
  value: {{ index .root.Values.redis.users .component | quote }}
- name: TW_REDIS_PASSWORD_FILE
  value: /etc/tokenwire/secrets/redis-password-{{ .component }}
{{- if .root.Values.redis.tlsCaSecret }}
- name: TW_REDIS_TLS_CA_FILE
  value: /etc/tokenwire/redis-tls/ca.crt
{{- end }}
{{- range $k, $v := .root.Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- define "tokenwire.volumeMounts" -}}
- name: secrets
  mountPath: /etc/tokenwire/secrets
  readOnly: true
{{- if .Values.redis.tlsCaSecret }}
- name: redis-tls
  mountPath: /etc/tokenwire/redis-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tokenwire.volumes" -}}
- name: secrets
  secret:
    secretName: {{ include "tokenwire.secretName" . }}
    defaultMode: 0400
{{- if .Values.redis.tlsCaSecret }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tlsCaSecret }}
{{- end }}
{{- end -}}

{{/* Probes on /healthz (alive) and /readyz (Kafka and Redis answer) of a named port. */}}
{{- define "tokenwire.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: {{ . }}}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ . }}}
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}
