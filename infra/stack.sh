#!/usr/bin/env bash
# Start, stop or inspect a whole tokenwire stack on this machine: Kafka, Redis, the topics,
# and one worker, batcher and edge. Idempotent. TW_STACK=demo|test picks ports and folders.
#   infra/stack.sh up [--brokers N] [--redis-cluster N] [--workers N] [--batchers N]
#                     [--edges N] | down | status
#
# --brokers N: Kafka as N KRaft nodes (infra/kafka.sh with TW_KAFKA_BROKERS=N; 3 or more
# replicate every topic 3 times with min.insync.replicas=2). The count is kept in
# $TW_RUN_DIR/kafka-brokers, so `down` and `status` (and infra/kafka.sh) act on the same
# nodes; `up` without --brokers keeps the stack's count, `--brokers 1` goes back to one.
# --redis-cluster N: Redis as a Redis Cluster of N masters (3 or more), each with
# TW_REDIS_REPLICAS replicas (default 1; infra/redis.sh with TW_REDIS_SHARDS=N), and the
# services told so (TW_REDIS_CLUSTER=true, TW_REDIS_URL any node's). The count is kept in
# $TW_RUN_DIR/redis-shards, as the brokers' is; `--redis-cluster 1` goes back to one node.
# Changing either count of a running stack: `down` first.
#
# TW_KAFKA_SECURITY=sasl_ssl (give it to every verb): the stack's broker speaks SASL_SSL
# only, with per-service users and ACLs (infra/kafka.sh, infra/kafka-acl.conf). Its TLS
# files are made here once with openssl (TW_KAFKA_TLS_DIR, default $TW_RUN_DIR/kafka-tls:
# a CA and a certificate for 127.0.0.1 signed by it) unless TW_KAFKA_TLS_CA_FILE,
# TW_KAFKA_SERVER_CERT_FILE and TW_KAFKA_SERVER_KEY_FILE name others; the topics are made
# as tw-admin and each service logs in as its own user, tw-<service>, with the password
# file kafka.sh made. Switching an existing stack: `infra/stack.sh down` and
# `TW_KAFKA_SECURITY=... infra/kafka.sh reset` (the data goes).
#
# Each service runs under a supervisor (`infra/stack.sh supervise NAME`, started by `up`)
# that restarts it whenever it exits, until `down`: a service is meant to exit only on
# SIGTERM or a bug, and neither must end the stack for good. The delay
# before a restart starts at TW_RESTART_MIN_S (1 s) and doubles up to TW_RESTART_MAX_S
# (30 s), so a service that cannot start does not spin; a run that lasted TW_RESTART_RESET_S
# (60 s) starts it over. Each restart is one JSON line (logger "supervisor") in the
# service's log, with the exit code and the delay.
#
# Files in $TW_RUN_DIR/pids: NAME.pid is the service process itself (rewritten at each
# restart, so whatever signals a service by its pid file keeps working), NAME.supervisor.pid
# its supervisor, NAME.restarts "<restarts> <last exit code>" since the supervisor started.
set -euo pipefail
if [ "${1:-}" = up ]; then
  shift
  while [ $# != 0 ]; do
    case "$1" in
      --brokers)
        [[ "${2:-}" =~ ^[1-9]$ ]] || { echo "--brokers takes 1 to 9, not '${2:-}'" >&2; exit 2; }
        export TW_KAFKA_BROKERS=$2 ;;
      --redis-cluster)
        [[ "${2:-}" =~ ^[1-9][0-9]?$ ]] && [ "$2" != 2 ] ||
          { echo "--redis-cluster takes 1 (one node) or 3 to 99 shards, not '${2:-}'" >&2; exit 2; }
        export TW_REDIS_SHARDS=$2 ;;
      --workers | --batchers | --edges)
        [[ "${2:-}" =~ ^[1-9]$ ]] || { echo "$1 takes 1 to 9, not '${2:-}'" >&2; exit 2; }
        declare "COUNT_${1#--}=$2" ;;
      *) echo "usage: $0 up [--brokers N] [--redis-cluster N] [--workers N] [--batchers N] [--edges N]" >&2; exit 2 ;;
    esac
    shift 2
  done
  set -- up
fi
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# The services' Redis clients follow the cluster's slots when Redis is a cluster.
[ "$TW_REDIS_SHARDS" = 1 ] || export TW_REDIS_CLUSTER=true
cd "$TW_ROOT"
# TW_BIN: another tokenwire executable (an installed one, a wrapper) than the project's venv.
TW="${TW_BIN:-$TW_ROOT/.venv/bin/tokenwire}"
PIDS="$TW_RUN_DIR/pids"
LOGS="$TW_RUN_DIR/logs"
mkdir -p "$PIDS" "$LOGS"
# --workers/--batchers/--edges N: N processes of that service, each under its own
# supervisor, named worker, worker2, ... (pid and log files by name). Edge K listens on
# TW_EDGE_PORT + K - 1. The counts are kept in $TW_RUN_DIR/service-counts, so `down` and
# `status` act on the same processes; `up` without them keeps the stack's counts.
[ ! -s "$TW_RUN_DIR/service-counts" ] || read -r KEPT_workers KEPT_batchers KEPT_edges <"$TW_RUN_DIR/service-counts"
COUNT_workers=${COUNT_workers:-${KEPT_workers:-1}}
COUNT_batchers=${COUNT_batchers:-${KEPT_batchers:-1}}
COUNT_edges=${COUNT_edges:-${KEPT_edges:-1}}
SERVICES=()
for kind in worker batcher edge; do
  count_var="COUNT_${kind}s"
  for ((k = 1; k <= ${!count_var}; k++)); do
    SERVICES+=("$kind$([ "$k" = 1 ] || echo "$k")")
  done
done
# The service an instance name runs: worker2 -> worker.
kind_of() { echo "${1%%[0-9]*}"; }
export TW_PORT="$TW_EDGE_PORT"
# The pepper API keys are stored under (HMAC-SHA-256): made once per stack, 0600, in its run
# folder; `tokenwire keys create` with the same TW_KEY_PEPPER_FILE makes keys this stack's
# edges accept. Keys are required unless TW_AUTH=off (the demo).
export TW_KEY_PEPPER_FILE="${TW_KEY_PEPPER_FILE:-$TW_RUN_DIR/key-pepper}"

export TW_KAFKA_SECURITY="${TW_KAFKA_SECURITY:-plaintext}"
KAFKA_TLS="${TW_KAFKA_TLS_DIR:-$TW_RUN_DIR/kafka-tls}"
if [ "$TW_KAFKA_SECURITY" = sasl_ssl ]; then
  export TW_KAFKA_TLS_CA_FILE="${TW_KAFKA_TLS_CA_FILE:-$KAFKA_TLS/ca.crt}"
  export TW_KAFKA_SERVER_CERT_FILE="${TW_KAFKA_SERVER_CERT_FILE:-$KAFKA_TLS/server.crt}"
  export TW_KAFKA_SERVER_KEY_FILE="${TW_KAFKA_SERVER_KEY_FILE:-$KAFKA_TLS/server.key}"
fi

# The secured broker's CA and certificate, made once (kept: the services trust this CA).
kafka_tls_files() {
  [ "$TW_KAFKA_SECURITY" = sasl_ssl ] && [ ! -s "$TW_KAFKA_SERVER_CERT_FILE" ] || return 0
  [ "$TW_KAFKA_SERVER_CERT_FILE" = "$KAFKA_TLS/server.crt" ] ||
    { echo "TW_KAFKA_SERVER_CERT_FILE=$TW_KAFKA_SERVER_CERT_FILE is missing" >&2; exit 2; }
  mkdir -p "$KAFKA_TLS" && chmod 700 "$KAFKA_TLS"
  (
    umask 077; cd "$KAFKA_TLS"
    openssl req -x509 -newkey rsa:2048 -nodes -days 825 -keyout ca.key -out ca.crt -subj "/CN=tokenwire $TW_STACK CA"
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=tw-kafka-broker
    # No extendedKeyUsage: the broker also presents it as a client to its controller.
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 -extfile server.ext -out server.crt
  ) >/dev/null 2>&1 || { echo "could not make the Kafka TLS files in $KAFKA_TLS" >&2; exit 1; }
  echo "made a CA and the broker's certificate in $KAFKA_TLS" >&2
}

# Log this process's Kafka clients in as user $1 (nothing unless the broker is secured).
kafka_login() {
  [ "$TW_KAFKA_SECURITY" = sasl_ssl ] || return 0
  export TW_KAFKA_SECURITY_PROTOCOL=SASL_SSL TW_KAFKA_USERNAME="$1"
  export TW_KAFKA_PASSWORD_FILE="${TW_KAFKA_ACL_DIR:-$TW_RUN_DIR/kafka-acl}/$1.password"
}

# Seconds with up to 3 decimals, as whole milliseconds (bash has integers only).
to_ms() {
  [[ "$2" =~ ^([0-9]+)(\.([0-9]{1,3}))?$ ]] || { echo "$1 must be seconds (e.g. 1 or 0.5), not '$2'" >&2; exit 2; }
  local frac="${BASH_REMATCH[3]}000"
  echo $((10#${BASH_REMATCH[1]} * 1000 + 10#${frac:0:3}))
}
# Milliseconds as seconds for a log line: 1000 -> 1, 250 -> 0.25.
ms_as_s() {
  local f
  f=$(printf '%03d' $(($1 % 1000)))
  while [[ "$f" == *0 ]]; do f=${f%0}; done
  echo "$(($1 / 1000))${f:+.$f}"
}
now_ms() { local t=${EPOCHREALTIME//[.,]/}; echo $((10#$t / 1000)); }
RESTART_MIN_MS=$(to_ms TW_RESTART_MIN_S "${TW_RESTART_MIN_S:-1}")
RESTART_MAX_MS=$(to_ms TW_RESTART_MAX_S "${TW_RESTART_MAX_S:-30}")
RESTART_RESET_MS=$(to_ms TW_RESTART_RESET_S "${TW_RESTART_RESET_S:-60}")
((RESTART_MIN_MS >= 100 && RESTART_MAX_MS >= RESTART_MIN_MS)) ||
  { echo "need 0.1 <= TW_RESTART_MIN_S <= TW_RESTART_MAX_S" >&2; exit 2; }

model_dir() {
  # Worker and batcher read the same model folder (the batcher only for its tokenizer).
  "$TW" model build --preset "${TW_MODEL_PRESET:-tiny}" 2>/dev/null | tail -n 1
}

# kill -0 also succeeds on a zombie: a process whose parent is gone waits for its reaper
# (PID 1, which can be slow in containers), so it counts as alive only if it is not one.
alive_pid() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$st" != Z ]; }

# The pid of a running service, from its pid file: trusted only while that process is
# `tokenwire NAME` (after a reboot the pid may be anyone's, and would be adopted or killed).
service_pid() {
  local pid
  pid=$(cat "$PIDS/$1.pid" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive_pid "$pid" || return 1
  [ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | tail -n 1)" = "$(kind_of "$1")" ] || return 1
  echo "$pid"
}
alive() { service_pid "$1" >/dev/null; }

# The pid of a service's supervisor; the pid file outlives a killed supervisor, so it is
# trusted only while that pid runs this script's `supervise NAME`.
supervisor_pid() {
  local pid
  pid=$(cat "$PIDS/$1.supervisor.pid" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive_pid "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "stack.sh supervise $1 " || return 1
  echo "$pid"
}

restarts_of() { local n; read -r n _ <"$PIDS/$1.restarts" 2>/dev/null && echo "${n:-0}" || echo 0; }

describe_exit() {
  # Bash reports a child killed by signal N as 128+N.
  if (($1 > 128)) && kill -l $(($1 - 128)) >/dev/null 2>&1; then
    echo "code $1 (SIG$(kill -l $(($1 - 128))))"
  else
    echo "code $1"
  fi
}

# `supervise NAME`: run one service and restart it whenever it exits, until SIGTERM. Its
# stdout and stderr are the service's log (start_service opens it).
supervise() {
  local name=$1 delay=$RESTART_MIN_MS restarts=0 stopping=0 child='' rc started ran how code nap
  # No -e here: a supervisor must outlive any one failed command (a full disk refusing a
  # log line, a pid file that cannot be written for a moment).
  set +e
  # SIGTERM (from `down`) only sets a flag: the supervisor leaves at its next step, never
  # between starting a service and recording its pid, and restarts nothing after it.
  trap 'stopping=1' TERM
  # Bash reports a background job killed by a signal ("... Killed") on its stderr; that
  # line would land in the service's JSON log, which gets this script's own line instead.
  # The service writes to the log (fd 3); the supervisor's stderr goes nowhere.
  exec 3>&2 2>/dev/null
  echo $$ >"$PIDS/$name.supervisor.pid"
  echo "0 -" >"$PIDS/$name.restarts"
  slog() {
    printf '{"t":%s,"level":"%s","service":"%s","logger":"supervisor","msg":"%s"%s}\n' \
      "$EPOCHREALTIME" "$1" "$name" "$2" "${3:-}"
  }
  # A sleep that SIGTERM cuts short: bash runs a trap only between commands, and `wait`
  # (unlike a foreground sleep) returns as soon as a trapped signal arrives.
  pause() { sleep "$1" & nap=$!; wait "$nap"; kill "$nap" 2>/dev/null; }

  TW_MODEL_DIR="${TW_MODEL_DIR:-$(model_dir)}"
  export TW_MODEL_DIR
  local kind number
  kind=$(kind_of "$name")
  number=${name#"$kind"}
  kafka_login "tw-$kind"
  if [ "$kind" = edge ]; then export TW_PORT=$((TW_EDGE_PORT + ${number:-1} - 1)); fi
  # A metrics port set for the stack: instance K takes the K-th from it.
  if [ "${TW_METRICS_PORT:-0}" != 0 ]; then export TW_METRICS_PORT=$((TW_METRICS_PORT + ${number:-1} - 1)); fi

  # A service left running without a supervisor (its supervisor was killed, or the stack
  # was started by an older script) is adopted: not a child, so it is polled, not waited for.
  child=$(service_pid "$name") && {
    slog INFO "supervising $name (pid $child), which was already running"
    started=$(now_ms)
    while [ "$stopping" = 0 ] && alive_pid "$child"; do pause 1; done
    [ "$stopping" = 0 ] && rc=unknown && rm -f "$PIDS/$name.pid"
  }

  while [ "$stopping" = 0 ]; do
    if [ -n "${rc:-}" ]; then
      ran=$(($(now_ms) - started))
      ((ran >= RESTART_RESET_MS)) && delay=$RESTART_MIN_MS
      restarts=$((restarts + 1))
      echo "$restarts $rc" >"$PIDS/$name.restarts"
      if [ "$rc" = unknown ]; then
        how="exit code unknown (not started by this supervisor)" code=null
      else
        how=$(describe_exit "$rc") code=$rc
      fi
      slog WARNING "$name exited with $how after $(ms_as_s $((ran / 100 * 100))) s; restart $restarts in $(ms_as_s "$delay") s" \
        ",\"exit_code\":$code,\"restart\":$restarts,\"delay_s\":$(ms_as_s "$delay")"
      pause "$(ms_as_s "$delay")"
      [ "$stopping" = 0 ] || break
      delay=$((delay * 2 > RESTART_MAX_MS ? RESTART_MAX_MS : delay * 2))
    fi
    started=$(now_ms)
    "$TW" "$kind" </dev/null 2>&3 3>&- &
    child=$!
    echo "$child" >"$PIDS/$name.pid"
    [ "$stopping" = 0 ] || break
    # `wait` also returns (with 128+signal) when SIGTERM interrupts it; the service then
    # still runs, and `down` stops it through its pid file.
    while :; do
      wait "$child"
      rc=$?
      [ "$stopping" = 0 ] || break 2
      alive_pid "$child" || break
    done
    rm -f "$PIDS/$name.pid"
  done
  rm -f "$PIDS/$name.supervisor.pid"
}

# The settings `up` starts services with: every TW_ and TOKENWIRE_ variable exported, each
# value as a digest (the run folder keeps no secret), one NAME=DIGEST a line. The profile's
# node counts are left out: `up --brokers N` exports them, a later `up` reads them from the
# run folder (env.sh), and the services learn their servers from the addresses.
settings_digest() {
  local var
  while IFS= read -r var; do
    printf '%s=%s\n' "$var" "$(printf '%s' "${!var}" | sha256sum | cut -c1-16)"
  done < <(compgen -e | grep -E '^(TW_|TOKENWIRE_)' | grep -vxE 'TW_KAFKA_BROKERS|TW_REDIS_SHARDS' | sort)
}

# The names whose digests differ between settings $1 and the file $2 (none: empty).
settings_changed() {
  printf '%s\n' "$1" | sort | comm -3 - <(sort "$2") | cut -d= -f1 | tr -d '\t' | sort -u \
    | paste -sd, -
}

# A running service is kept when `up` has the settings it started with; with others (the
# demo's TW_AUTH=off on a stack up with keys required, another model) it is restarted, as
# `docker compose up` recreates a changed container. One started before its settings were
# recorded is kept, and they are recorded now. A service whose supervisor is gone is adopted
# by the new one unless its settings changed.
start_service() {
  local name=$1 settings changed=''
  settings=$(settings_digest)
  [ ! -f "$PIDS/$name.settings" ] || changed=$(settings_changed "$settings" "$PIDS/$name.settings")
  if supervisor_pid "$name" >/dev/null; then
    [ -f "$PIDS/$name.settings" ] || { printf '%s\n' "$settings" >"$PIDS/$name.settings"; return; }
    [ -n "$changed" ] || return 0
    echo "$name: restarting, its settings changed since it started ($changed)"
    stop_supervisor "$name"
    stop_service "$name"
  elif [ -n "$changed" ] && alive "$name"; then
    echo "$name: restarting, its settings changed since it started ($changed)"
    stop_service "$name"
  fi
  printf '%s\n' "$settings" >"$PIDS/$name.settings"
  # setsid: the supervisor and its service outlive this shell and are out of reach of the
  # terminal's Ctrl-C (demo.sh traps it and runs `down`); nohup: and of its hang-up.
  nohup setsid bash "$TW_ROOT/infra/stack.sh" supervise "$name" >>"$LOGS/$name.log" 2>&1 </dev/null &
  for _ in $(seq 1 100); do
    supervisor_pid "$name" >/dev/null && alive "$name" && return
    sleep 0.1
  done
  echo "$name did not start under its supervisor; see $LOGS/$name.log" >&2
  return 1
}

# Supervisors go first, so that nothing restarts a service that `down` is stopping.
stop_supervisor() {
  local name=$1 pid
  pid=$(supervisor_pid "$name") || { rm -f "$PIDS/$name.supervisor.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do alive_pid "$pid" || break; sleep 0.1; done
  if alive_pid "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$PIDS/$name.supervisor.pid" "$PIDS/$name.settings"
}

stop_service() {
  local name=$1 pid
  pid=$(service_pid "$name") || { rm -f "$PIDS/$name.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do alive_pid "$pid" || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDS/$name.pid"
}

# A worker heartbeat is in Redis (a cluster: on one of its masters).
heartbeat_seen() {
  local port ports=$TW_REDIS_PORT
  [ "$TW_REDIS_SHARDS" = 1 ] || ports=$(infra/redis.sh nodes | awk '$3 == "master" && $4 == "up" { print $2 }')
  for port in $ports; do
    [ -z "$(redis-cli -p "$port" --scan --pattern "${TW_TOPIC_PREFIX:-tw}:hb:*" | head -n1)" ] || return 0
  done
  return 1
}

# Every edge answers /healthz.
edges_answer() {
  local k
  for ((k = 0; k < COUNT_edges; k++)); do
    curl -fs "http://127.0.0.1:$((TW_EDGE_PORT + k))/healthz" >/dev/null 2>&1 || return 1
  done
}

wait_ready() {
  # The edge answers /healthz and a worker heartbeat is in Redis. A service that exits
  # while the stack starts is reported at once: its supervisor would restart it, but an
  # exit this early is a configuration error more often than a crash.
  local before=("$@") i s
  for _ in $(seq 1 300); do
    for i in "${!SERVICES[@]}"; do
      s=${SERVICES[$i]}
      if ! supervisor_pid "$s" >/dev/null || (($(restarts_of "$s") > before[i])); then
        echo "$s exited while the stack started (its supervisor restarts it; 'infra/stack.sh down' stops everything); last log lines:" >&2
        tail -n 30 "$LOGS/$s.log" >&2
        return 1
      fi
    done
    if edges_answer && heartbeat_seen; then
      return 0
    fi
    sleep 0.2
  done
  echo "stack did not become ready in 60 s" >&2
  return 1
}

dev_key() {
  # A development API key (tenant "dev"), made once per stack and kept in its run folder;
  # only its SHA-256 goes to Redis (the edge's key hash), so any edge of the stack knows it.
  local file="$TW_RUN_DIR/dev-api-key" key digest
  if [ ! -s "$file" ]; then
    (umask 077; printf 'twk-dev-%s\n' "$(head -c 18 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')" >"$file")
  fi
  key=$(cat "$file")
  digest=$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)
  redis-cli -c -p "$TW_REDIS_PORT" HSET "${TW_TOPIC_PREFIX:-tw}:apikeys" "$digest" dev >/dev/null
  echo "$key"
}

case "${1:-}" in
  up)
    TW_MODEL_DIR="${TW_MODEL_DIR:-$(model_dir)}"
    export TW_MODEL_DIR
    "$TW" keys pepper --file "$TW_KEY_PEPPER_FILE" >/dev/null
    echo "$TW_KAFKA_BROKERS" >"$TW_RUN_DIR/kafka-brokers"
    echo "$TW_REDIS_SHARDS" >"$TW_RUN_DIR/redis-shards"
    echo "$COUNT_workers $COUNT_batchers $COUNT_edges" >"$TW_RUN_DIR/service-counts"
    kafka_tls_files
    infra/kafka.sh start
    infra/redis.sh start
    (kafka_login tw-admin && "$TW" topics create)
    counts=()
    for s in "${SERVICES[@]}"; do
      # A supervisor started now begins at 0 restarts; one kept running keeps its count.
      kept=$(supervisor_pid "$s") || kept=''
      start_service "$s"
      if [ -n "$kept" ] && [ "$(supervisor_pid "$s")" = "$kept" ]; then
        counts+=("$(restarts_of "$s")")
      else
        counts+=(0)
      fi
    done
    wait_ready "${counts[@]}"
    echo "tokenwire ($TW_STACK) is serving at http://127.0.0.1:$TW_EDGE_PORT$( ((COUNT_edges == 1)) || echo " to :$((TW_EDGE_PORT + COUNT_edges - 1))")"
    echo "development API key (tenant dev): $(dev_key)  (send 'Authorization: Bearer <key>'; keys are ${TW_AUTH:-required}; more: tokenwire keys create --tenant T)"
    ;;
  down)
    for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do stop_supervisor "${SERVICES[$i]}"; done
    for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do stop_service "${SERVICES[$i]}"; done
    infra/redis.sh stop
    infra/kafka.sh stop
    ;;
  status)
    # 0 while every service is supervised (running, or waiting to be restarted) and Kafka
    # and Redis answer; a service between two runs is its supervisor's business.
    rc=0
    for s in "${SERVICES[@]}"; do
      line="$s: stopped"
      pid=$(service_pid "$s") && line="$s: running (pid $pid"
      if sup=$(supervisor_pid "$s"); then
        read -r n last <"$PIDS/$s.restarts" 2>/dev/null || { n=0; last=-; }
        [ -n "$pid" ] || line="$s: restarting (supervisor pid $sup"
        [ -n "$pid" ] && line+=", supervisor pid $sup"
        line+=", restarts: $n"
        [ "$last" = - ] || line+=", last exit $last"
        line+=")"
      else
        rc=1
        [ -n "$pid" ] && line+=", unsupervised: 'infra/stack.sh up' adopts it)"
      fi
      echo "$line"
    done
    infra/kafka.sh status || { echo "kafka: not answering"; rc=1; }
    infra/redis.sh status || { echo "redis: not answering"; rc=1; }
    exit $rc
    ;;
  supervise)
    [[ "${2:-}" =~ ^(worker|batcher|edge)[2-9]?$ ]] || { echo "usage: $0 supervise worker|batcher|edge[2-9]" >&2; exit 2; }
    supervise "$2"
    ;;
  *) echo "usage: $0 up [--brokers N] [--redis-cluster N] [--workers N] [--batchers N] [--edges N]|down|status" >&2; exit 2 ;;
esac
