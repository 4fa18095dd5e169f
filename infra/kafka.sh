#!/usr/bin/env bash
# Kafka (KRaft, broker+controller in one JVM per node) on 127.0.0.1 for the demo and test
# stacks, run from the Maven jars that bootstrap.sh caches. Idempotent verbs:
#   infra/kafka.sh start|stop|status|logs [tail args]|reset
#   infra/kafka.sh start|stop|kill|status|logs NODE    (one node of a cluster, from 1)
# TW_KAFKA_WIPE=1 with start (or `reset`) deletes the data first.
# TW_KAFKA_BROKERS=N (default 1; infra/env.sh): N nodes with an N-voter quorum, node i on the
#   i-th ports of TW_KAFKA_PORTS/TW_KAFKA_CONTROLLER_PORTS, its data in
#   $TW_RUN_DIR/kafka-cluster/node-i (one node: $TW_RUN_DIR/kafka, as always). `kill` is a
#   kill -9 of that node's JVM (fault tests); `stop` is its controlled shutdown. Internal and
#   default topics are replicated TW_KAFKA_REPLICATION_FACTOR times with
#   TW_KAFKA_MIN_INSYNC_REPLICAS in sync (the settings `tokenwire topics create` reads).
#   Each JVM's heap: TW_KAFKA_HEAP (default 512m; 256m per node of a cluster).
# TW_KAFKA_SECURITY=sasl_ssl: the client port speaks SASL_SSL only (SCRAM-SHA-512/256 over
#   TLS with TW_KAFKA_SERVER_CERT_FILE and TW_KAFKA_SERVER_KEY_FILE, signed by
#   TW_KAFKA_TLS_CA_FILE); the controller port speaks TLS with client certificates (the
#   broker's own); the StandardAuthorizer allows what infra/kafka-acl.conf lists for the
#   topic prefix TW_TOPIC_PREFIX (and the services of TW_REQUEST_SOURCES), tw-admin is the
#   super user. Passwords: TW_KAFKA_ACL_DIR (default $TW_RUN_DIR/kafka-acl: <user>.password,
#   made when missing, 0600). Switching an existing broker's security needs a reset. The
#   broker's certificate is also its client certificate towards the controller: it must
#   not be restricted to serverAuth (no extendedKeyUsage, or clientAuth among them).
# TW_KAFKA_MTLS_PORT (with sasl_ssl): a second client port that speaks TLS with client
#   certificates (ssl.client.auth=required, signed by TW_KAFKA_TLS_CA_FILE): a client's
#   user is its certificate's CN (CN=tw-worker logs in as tw-worker, under the same ACLs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
TW_KAFKA_SECURITY="${TW_KAFKA_SECURITY:-plaintext}"
TW_KAFKA_ACL_DIR="${TW_KAFKA_ACL_DIR:-$TW_RUN_DIR/kafka-acl}"
case "$TW_KAFKA_SECURITY" in
  plaintext | sasl_ssl) ;;
  *) printf '[kafka:%s] TW_KAFKA_SECURITY must be plaintext or sasl_ssl, not "%s"\n' "$TW_STACK" "$TW_KAFKA_SECURITY" >&2; exit 2 ;;
esac

BROKERS=$TW_KAFKA_BROKERS
IFS=, read -ra PORTS <<<"$TW_KAFKA_PORTS"
IFS=, read -ra CONTROLLER_PORTS <<<"$TW_KAFKA_CONTROLLER_PORTS"
REPLICATION="${TW_KAFKA_REPLICATION_FACTOR:-1}"
MIN_INSYNC="${TW_KAFKA_MIN_INSYNC_REPLICAS:-1}"
LIBS="${TW_KAFKA_LIBS:-$TOKENWIRE_CACHE/kafka-libs}"
if [ "$BROKERS" = 1 ]; then HEAP="${TW_KAFKA_HEAP:-512m}"; else HEAP="${TW_KAFKA_HEAP:-256m}"; fi
NODE=1

log() { printf '[kafka:%s%s] %s\n' "$TW_STACK" "$([ "$BROKERS" = 1 ] || echo ":$NODE")" "$*" >&2; }

if [ "${#PORTS[@]}" != "$BROKERS" ] || [ "${#CONTROLLER_PORTS[@]}" != "$BROKERS" ]; then
  log "TW_KAFKA_BROKERS=$BROKERS needs as many TW_KAFKA_PORTS ($TW_KAFKA_PORTS) and TW_KAFKA_CONTROLLER_PORTS (${TW_KAFKA_CONTROLLER_PORTS:-})"
  exit 2
fi
if ! [[ "$REPLICATION" =~ ^[1-9]$ && "$MIN_INSYNC" =~ ^[1-9]$ ]] ||
  ((REPLICATION > BROKERS || MIN_INSYNC > REPLICATION)); then
  log "need 1 <= TW_KAFKA_MIN_INSYNC_REPLICAS ($MIN_INSYNC) <= TW_KAFKA_REPLICATION_FACTOR ($REPLICATION) <= TW_KAFKA_BROKERS ($BROKERS)"
  exit 2
fi

# Node $1's folders, ports and JVM options; one node keeps the single broker's folder.
select_node() {
  NODE=$1
  if [ "$BROKERS" = 1 ]; then
    DIR="$TW_RUN_DIR/kafka"
    CLUSTER_ID_FILE="$DIR/cluster.id"
  else
    DIR="$TW_RUN_DIR/kafka-cluster/node-$NODE"
    CLUSTER_ID_FILE="$TW_RUN_DIR/kafka-cluster/cluster.id"
  fi
  DATA="$DIR/data"
  LOGS="$DIR/logs"
  CONF="$DIR/server.properties"
  PIDFILE="$DIR/kafka.pid"
  PORT=${PORTS[NODE - 1]}
  CONTROLLER_PORT=${CONTROLLER_PORTS[NODE - 1]}
  local min=$HEAP
  [[ "$HEAP" =~ ^([0-9]+)m$ ]] && min="$((BASH_REMATCH[1] / 2))m"
  JAVA_OPTS=("-Xmx$HEAP" "-Xms$min" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
    -Djava.awt.headless=true -Dkafka.logs.dir="$LOGS"
    -Dlog4j2.configurationFile="$TW_ROOT/infra/kafka/log4j2.yaml")
}
select_node 1

# kill -0 also succeeds on a zombie: an exited daemon waits for its reaper (PID 1, which
# can be slow in containers), so a process counts as alive only if it is not one.
alive() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$st" != Z ]; }

# The pid file alone can be stale (reboot, kill -9, pid reuse): trust it only if that pid
# is a kafka.Kafka JVM running *this* stack's config.
running_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $CONF" || return 1
  echo "$pid"
}

# A bare TCP connect succeeds as soon as the listener socket is bound, before Kafka serves
# requests; an ApiVersions (v0) round trip proves the request path is really up. SASL
# allows ApiVersions before the login, so over TLS the same bytes go through openssl.
API_VERSIONS='\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x01\x00\x02tw'
answers() (
  if [ "$TW_KAFKA_SECURITY" = sasl_ssl ]; then
    # -quiet implies -ign_eof: the session stays open for the answer until head has it,
    # and until timeout ends it (status 124, which must not end this subshell under -e).
    n=$(printf "$API_VERSIONS" | timeout 2 openssl s_client -quiet -verify_return_error \
      -CAfile "$TW_KAFKA_TLS_CA_FILE" -connect "127.0.0.1:$PORT" | head -c 4 | wc -c) || true
    [ "$n" -eq 4 ]
    exit
  fi
  exec 3<>"/dev/tcp/127.0.0.1/$PORT" || exit 1
  printf "$API_VERSIONS" >&3
  [ "$(timeout 0.5 head -c 4 <&3 | wc -c)" -eq 4 ]
) 2>/dev/null

# The largest message: the constant in shared/kafka_io.py that producers, consumers and
# topics are sized by (a product of integers there, evaluated here).
max_message_bytes() {
  local expr
  expr=$(sed -nE 's/^MAX_MESSAGE_BYTES = ([0-9 *]+)$/\1/p' "$TW_ROOT/shared/kafka_io.py")
  [ -n "$expr" ] || { log "no MAX_MESSAGE_BYTES line in shared/kafka_io.py"; exit 1; }
  echo $((expr))
}

# The listeners: one PLAINTEXT port, or (sasl_ssl) SASL_SSL for clients and mTLS between
# the broker and its controller, with the authorizer.
listeners_config() {
  if [ "$TW_KAFKA_SECURITY" != sasl_ssl ]; then
    cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
EOF
    return
  fi
  local subject admin_pw
  # Kafka reads a PEM key store as the key followed by its certificate chain.
  (umask 077; cat "$TW_KAFKA_SERVER_KEY_FILE" "$TW_KAFKA_SERVER_CERT_FILE" >"$DIR/server.pem")
  # The broker reaches its controller with its own certificate: that subject is a super user.
  subject=$(openssl x509 -in "$TW_KAFKA_SERVER_CERT_FILE" -noout -subject -nameopt RFC2253 | sed 's/^subject=//')
  admin_pw=$(password tw-admin)
  # The mTLS port: the principal is the certificate's CN (this listener's rule only; the
  # controller's keeps the whole subject, the super user above).
  local mtls="" mtls_map="" mtls_conf=""
  if [ -n "${TW_KAFKA_MTLS_PORT:-}" ]; then
    mtls=",MTLS://127.0.0.1:$TW_KAFKA_MTLS_PORT" mtls_map=",MTLS:SSL"
    mtls_conf='listener.name.mtls.ssl.client.auth=required
listener.name.mtls.ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,RULE:^CN=([^,]+),.*$/$1/,DEFAULT'
  fi
  cat <<EOF
listeners=SASL_SSL://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT$mtls
advertised.listeners=SASL_SSL://127.0.0.1:$PORT$mtls
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL$mtls_map
$mtls_conf
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="tw-admin" password="$admin_pw";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=$DIR/server.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TW_KAFKA_TLS_CA_FILE
listener.name.controller.ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:tw-admin;User:$subject
EOF
}

check_security_files() {
  local f
  [ "$TW_KAFKA_SECURITY" = sasl_ssl ] || return 0
  for f in TW_KAFKA_SERVER_CERT_FILE TW_KAFKA_SERVER_KEY_FILE TW_KAFKA_TLS_CA_FILE; do
    [ -s "${!f:-}" ] || { log "TW_KAFKA_SECURITY=sasl_ssl needs $f"; exit 2; }
  done
}

# A user's password, made once (kept: services read it) in a 0600 file.
password() {
  local file="$TW_KAFKA_ACL_DIR/$1.password"
  mkdir -p "$TW_KAFKA_ACL_DIR" && chmod 700 "$TW_KAFKA_ACL_DIR"
  [ -s "$file" ] || (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$file")
  cat "$file"
}

# The lines of infra/kafka-acl.conf for this prefix and these backend services, as
# SecurityTool reads them: each user once (with its password file), then each rule.
security_lines() {
  local prefix="${TW_TOPIC_PREFIX:-tw}" svc rules="" user
  rules=$(grep -Ev '^[[:space:]]*(#|$)' "$TW_ROOT/infra/kafka-acl.conf" | grep -v '{svc}' || true)
  # TW_REQUEST_SOURCES: "svc:tenants[:priorities[:reply_topics]]" joined by ';'
  # (services/batcher/sources.py): a service's reply topics besides its own are written by
  # the workers (and a batcher answering from the cache) and read by that service.
  local source topic
  while IFS= read -r source; do
    svc=$(printf '%s' "$source" | cut -d: -f1 | tr -d ' ')
    [ -n "$svc" ] || continue
    rules+=$'\n'$(grep -Ev '^[[:space:]]*#' "$TW_ROOT/infra/kafka-acl.conf" | grep '{svc}' | sed "s/{svc}/$svc/g")
    for topic in $(printf '%s' "$source" | cut -s -d: -f4 | tr ',' ' '); do
      rules+=$'\n'"tw-worker WRITE TOPIC LITERAL $topic"$'\n'"tw-worker READ TOPIC LITERAL $topic"
      rules+=$'\n'"tw-batcher WRITE TOPIC LITERAL $topic"$'\n'"tw-svc-$svc READ TOPIC LITERAL $topic"
    done
  done < <(printf '%s\n' "${TW_REQUEST_SOURCES:-}" | tr ';' '\n')
  rules=$(printf '%s\n' "$rules" | sed "s/{p}/$prefix/g" | grep -v '^[[:space:]]*$')
  for user in $(printf '%s\n' "$rules" | awk '{print $1}' | awk '!seen[$0]++'); do
    password "$user" >/dev/null
    echo "user $user $TW_KAFKA_ACL_DIR/$user.password"
  done
  printf '%s\n' "$rules" | awk '{print "acl", $1, $2, $3, $4, $5}'
}

# The users and rules, applied through the super user's login (each start: idempotent).
apply_security() {
  local out
  out=$(security_lines | java -Dkafka.logs.dir="$LOGS/security-tool" \
    -Dlog4j2.configurationFile="$TW_ROOT/infra/kafka/log4j2.yaml" -cp "$LIBS/*" \
    "$TW_ROOT/infra/kafka/SecurityTool.java" "127.0.0.1:$PORT" "$TW_KAFKA_TLS_CA_FILE" \
    tw-admin "$TW_KAFKA_ACL_DIR/tw-admin.password" 2>&1) || { log "users and ACLs not applied: $out"; exit 1; }
  log "$out (prefix ${TW_TOPIC_PREFIX:-tw})"
}

# One node: a dynamic quorum of itself. A cluster: a static quorum of every node.
quorum_config() {
  if [ "$BROKERS" = 1 ]; then
    cat <<EOF
# Dynamic quorum (KIP-853): formatted with --standalone, so no static voters list.
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
EOF
    return
  fi
  local voters="" i
  for ((i = 1; i <= BROKERS; i++)); do voters+="${voters:+,}$i@127.0.0.1:${CONTROLLER_PORTS[i - 1]}"; done
  cat <<EOF
# Static quorum: every node is a voter (formatted without --standalone).
controller.quorum.voters=$voters
# A node killed without a goodbye is fenced, and its partitions get new leaders, after 6 s
# without a heartbeat (default 9 s).
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
# Fewer threads than the defaults: the nodes share one machine.
num.network.threads=2
num.io.threads=2
background.threads=4
EOF
}

write_config() {
  local max_bytes
  max_bytes=$(max_message_bytes)
  rm -f "$CONF"; (umask 077; : >"$CONF")  # it may hold the inter-broker password
  cat >"$CONF" <<EOF
# Generated by infra/kafka.sh on each start; edit the script, not this file.
node.id=$NODE
process.roles=broker,controller
$(quorum_config)
controller.listener.names=CONTROLLER
$(listeners_config)
log.dirs=$DATA
# Internal topics and topics created without these settings: replicated as the project's
# own (TW_KAFKA_REPLICATION_FACTOR, TW_KAFKA_MIN_INSYNC_REPLICAS; 1 and 1 on one node).
offsets.topic.replication.factor=$REPLICATION
transaction.state.log.replication.factor=$REPLICATION
transaction.state.log.min.isr=$MIN_INSYNC
share.coordinator.state.topic.replication.factor=$REPLICATION
share.coordinator.state.topic.min.isr=$MIN_INSYNC
default.replication.factor=$REPLICATION
min.insync.replicas=$MIN_INSYNC
num.partitions=1
# Topics are created explicitly (tokenwire topics create / tests), never by a typo.
auto.create.topics.enable=false
# No 3 s wait before the first consumer-group rebalance; lets tests use short sessions.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# The default 128 MB cleaner buffer is a quarter of our heap.
log.cleaner.dedupe.buffer.size=33554432
log.retention.hours=24
log.segment.bytes=67108864
# Set with the clients' limits from one constant (see max_message_bytes).
message.max.bytes=$max_bytes
EOF
}

cluster_id() {
  [ -s "$CLUSTER_ID_FILE" ] && return 0
  # 16 random bytes as Kafka's Uuid prints them: 22 chars of unpadded base64url; Kafka
  # itself never hands out ids starting with '-' (they read as a command-line flag).
  local id
  while id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | cut -c1-22); [[ $id == -* ]]; do :; done
  mkdir -p "$(dirname "$CLUSTER_ID_FILE")"
  echo "$id" >"$CLUSTER_ID_FILE"
}

format_once() {
  [ -f "$DATA/meta.properties" ] && return 0
  log "formatting $DATA (cluster id $(cat "$CLUSTER_ID_FILE"))"
  # A secured broker starts with its super user, whose login applies the other users and
  # the ACLs (apply_security). The format tool takes the password only as an argument.
  local scram=() quorum=()
  [ "$BROKERS" = 1 ] && quorum=(--standalone)
  [ "$TW_KAFKA_SECURITY" = sasl_ssl ] &&
    scram=(--add-scram "SCRAM-SHA-512=[name=tw-admin,password=$(password tw-admin)]")
  java "${JAVA_OPTS[@]}" -cp "$LIBS/*" kafka.tools.StorageTool format \
    --cluster-id "$(cat "$CLUSTER_ID_FILE")" --config "$CONF" "${quorum[@]}" "${scram[@]}" \
    >"$LOGS/format.log" 2>&1 \
    || { cat "$LOGS/format.log" >&2; exit 1; }
}

wait_ready() {
  local pid=$1 t0=$EPOCHREALTIME deadline=$((SECONDS + ${TW_KAFKA_START_TIMEOUT:-60}))
  until answers; do
    if ! alive "$pid" || [ $SECONDS -ge $deadline ]; then
      log "did not come up on 127.0.0.1:$PORT; end of $LOGS/server.log and kafka.out:"
      tail -n 20 "$LOGS/server.log" "$LOGS/kafka.out" >&2 2>/dev/null || true
      log "last errors:"; grep -E '^\[.*\] ERROR|^Caused by' "$LOGS/server.log" | tail -n 4 >&2 || true
      exit 1
    fi
    sleep 0.2
  done
  log "ready on 127.0.0.1:$PORT (pid $pid, $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME-$t0}") s)"
}

# Start the given nodes (each running one is left as it is), then wait until each answers:
# a cluster's nodes serve only once a majority of the quorum runs, so all start first.
start() {
  local i pid waiting=() starting=() formats=()
  [ "${TW_KAFKA_WIPE:-0}" = 1 ] && stop "$@"   # wiping under a live broker would corrupt it
  [ -f "$LIBS/.complete" ] || { log "no Kafka jars in $LIBS: run infra/bootstrap.sh"; exit 1; }
  check_security_files
  if [ "${TW_KAFKA_WIPE:-0}" = 1 ]; then
    for i in "$@"; do select_node "$i"; log "wiping $DATA"; rm -rf "$DATA"; done
    # A new cluster id only with every node wiped: the others' data belongs to the old one.
    [ $# != "$BROKERS" ] || rm -f "$CLUSTER_ID_FILE"
  fi
  cluster_id
  for i in "$@"; do
    select_node "$i"
    if pid=$(running_pid); then
      answers && { log "already running (pid $pid)"; continue; }
      waiting+=("$i"); continue   # started by someone else a moment ago: wait for it
    fi
    if answers; then log "port $PORT is served by another process"; exit 1; fi
    mkdir -p "$DATA" "$LOGS"
    write_config
    starting+=("$i")
  done
  # The nodes' storage is formatted side by side (a JVM each), then each node starts.
  for i in "${starting[@]}"; do select_node "$i"; format_once & formats+=($!); done
  for pid in "${formats[@]}"; do wait "$pid" || exit 1; done
  for i in "${starting[@]}"; do
    select_node "$i"
    # setsid: the broker outlives the shell and is not hit by the caller's Ctrl-C; the inner
    # bash writes its own pid and then becomes the JVM, so the pid file names the JVM.
    nohup setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
      java "${JAVA_OPTS[@]}" -cp "$LIBS/*" kafka.Kafka "$CONF" >"$LOGS/kafka.out" 2>&1 </dev/null &
    pid=""
    for _ in $(seq 50); do pid=$(running_pid) && break; sleep 0.1; done
    [ -n "${pid:-}" ] || { log "JVM did not start"; cat "$LOGS/kafka.out" >&2; exit 1; }
    waiting+=("$i")
  done
  for i in "${waiting[@]}"; do
    select_node "$i"
    wait_ready "$(cat "$PIDFILE" 2>/dev/null || echo 0)"
  done
}

# Stop the given nodes, all at once: a node's controlled shutdown needs the quorum, which
# the last of several nodes stopped one by one would lack.
stop() {
  local i pid up stopping=()
  for i in "$@"; do
    select_node "$i"
    pid=$(running_pid) || { rm -f "$PIDFILE"; continue; }
    kill -TERM "$pid"
    stopping+=("$i:$pid")
  done
  # Controlled shutdown flushes the logs and the metadata snapshot; give it time.
  for _ in $(seq 100); do
    up=0
    for i in "${stopping[@]}"; do alive "${i#*:}" && up=1; done
    [ "$up" = 1 ] || break
    sleep 0.2
  done
  for i in "${stopping[@]}"; do
    select_node "${i%%:*}"
    if alive "${i#*:}"; then log "still up after 20 s, killing"; kill -KILL "${i#*:}"; fi
    rm -f "$PIDFILE"
    log "stopped"
  done
}

# kill -9 of one node (a crash, for fault tests): no controlled shutdown, no flush.
kill_node() {
  local pid
  select_node "$1"
  pid=$(running_pid) || { log "not running"; return 0; }
  kill -KILL "$pid"
  for _ in $(seq 100); do alive "$pid" || break; sleep 0.05; done
  rm -f "$PIDFILE"
  log "killed (pid $pid)"
}

status() {
  local i
  for i in "$@"; do select_node "$i"; running_pid >/dev/null && answers || return 1; done
}

# The nodes a verb acts on: the one named (from 1), or every node.
nodes() {
  if [ -z "${1:-}" ]; then seq 1 "$BROKERS"; return; fi
  [[ "$1" =~ ^[1-9]$ ]] && (($1 <= BROKERS)) || { log "no node '$1' (TW_KAFKA_BROKERS=$BROKERS)"; exit 2; }
  echo "$1"
}

# A secured broker's users and rules are applied on every start (a running one's too).
secure() { [ "$TW_KAFKA_SECURITY" != sasl_ssl ] || { select_node 1; apply_security; }; }

verb=${1:-}
[ $# = 0 ] || shift
case "$verb" in
  start) ns=$(nodes "${1:-}"); start $ns; secure ;;
  stop) ns=$(nodes "${1:-}"); stop $ns ;;
  kill)
    [ -n "${1:-}" ] || [ "$BROKERS" = 1 ] || { log "kill needs a node (1-$BROKERS)"; exit 2; }
    ns=$(nodes "${1:-1}"); kill_node "$ns" ;;
  status) ns=$(nodes "${1:-}"); status $ns ;;
  logs)
    node=1
    if [ "$BROKERS" != 1 ] && [[ "${1:-}" =~ ^[1-9]$ ]]; then node=$(nodes "$1"); shift; fi
    select_node "$node"
    tail -n 200 "$@" "$LOGS/server.log"
    ;;
  reset) TW_KAFKA_WIPE=1 start $(nodes ""); secure ;;
  *) echo "usage: $0 start|stop|status|logs [tail args]|reset; start|stop|kill|status|logs NODE" >&2; exit 2 ;;
esac
