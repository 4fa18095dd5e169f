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
- name: TW_REDIS_CLUSTER
  value: {{ .root.Values.redis.cluster | quote }}
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
{{- include "tokenwire.kafkaEnv" . }}
{{- range $k, $v := .root.Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* A service's Kafka login (kafka.securityProtocol): (dict "root" $ "component" "edge") */}}
{{- define "tokenwire.kafkaEnv" -}}
{{- $k := .root.Values.kafka }}
{{- if not (has $k.securityProtocol (list "PLAINTEXT" "SASL_SSL" "SSL")) }}
{{- fail (printf "kafka.securityProtocol must be PLAINTEXT, SASL_SSL or SSL, not %q" $k.securityProtocol) }}
{{- end }}
{{- if ne $k.securityProtocol "PLAINTEXT" }}
- name: TW_KAFKA_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if $k.tlsCaSecret }}
- name: TW_KAFKA_TLS_CA_FILE
  value: /etc/tokenwire/kafka-tls/ca.crt
{{- end }}
{{- if eq $k.securityProtocol "SASL_SSL" }}
{{- if not $k.passwordSecret }}
{{- fail "kafka.securityProtocol=SASL_SSL needs kafka.passwordSecret (a Secret with keys edge, batcher, worker)" }}
{{- end }}
- name: TW_KAFKA_SASL_MECHANISM
  value: {{ $k.saslMechanism | quote }}
- name: TW_KAFKA_USERNAME
  value: {{ index $k.users .component | quote }}
- name: TW_KAFKA_PASSWORD_FILE
  value: /etc/tokenwire/kafka-sasl/{{ .component }}
{{- end }}
{{- if index $k.clientCertSecrets .component }}
- name: TW_KAFKA_TLS_CERT_FILE
  value: /etc/tokenwire/kafka-client/tls.crt
- name: TW_KAFKA_TLS_KEY_FILE
  value: /etc/tokenwire/kafka-client/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Mounts and volumes of a service's secrets: (dict "root" $ "component" "edge") */}}
{{- define "tokenwire.volumeMounts" -}}
{{- $k := .root.Values.kafka }}
- name: secrets
  mountPath: /etc/tokenwire/secrets
  readOnly: true
{{- if .root.Values.redis.tlsCaSecret }}
- name: redis-tls
  mountPath: /etc/tokenwire/redis-tls
  readOnly: true
{{- end }}
{{- if ne $k.securityProtocol "PLAINTEXT" }}
{{- if $k.tlsCaSecret }}
- name: kafka-tls
  mountPath: /etc/tokenwire/kafka-tls
  readOnly: true
{{- end }}
{{- if eq $k.securityProtocol "SASL_SSL" }}
- name: kafka-sasl
  mountPath: /etc/tokenwire/kafka-sasl
  readOnly: true
{{- end }}
{{- if index $k.clientCertSecrets .component }}
- name: kafka-client
  mountPath: /etc/tokenwire/kafka-client
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "tokenwire.volumes" -}}
{{- $k := .root.Values.kafka }}
- name: secrets
  secret:
    secretName: {{ include "tokenwire.secretName" .root }}
    defaultMode: 0400
{{- if .root.Values.redis.tlsCaSecret }}
- name: redis-tls
  secret:
    secretName: {{ .root.Values.redis.tlsCaSecret }}
{{- end }}
{{- if ne $k.securityProtocol "PLAINTEXT" }}
{{- with $k.tlsCaSecret }}
- name: kafka-tls
  secret:
    secretName: {{ . }}
    items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- if eq $k.securityProtocol "SASL_SSL" }}
- name: kafka-sasl
  secret:
    secretName: {{ $k.passwordSecret }}
    items: [{key: {{ .component }}, path: {{ .component }}}]
    defaultMode: 0400
{{- end }}
{{- with index $k.clientCertSecrets .component }}
- name: kafka-client
  secret:
    secretName: {{ . }}
    defaultMode: 0400
{{- end }}
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
