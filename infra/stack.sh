#!/usr/bin/env bash
# Start, stop or inspect a whole tokenwire stack on this machine: Kafka, Redis, the topics,
# and one worker, batcher and edge. Idempotent. TW_STACK=demo|test picks ports and folders.
#   infra/stack.sh up | down | status
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$TW_ROOT"
TW="$TW_ROOT/.venv/bin/tokenwire"
PIDS="$TW_RUN_DIR/pids"
LOGS="$TW_RUN_DIR/logs"
SERVICES=(worker batcher edge)
mkdir -p "$PIDS" "$LOGS"
export TW_PORT="$TW_EDGE_PORT"
# Worker and batcher read the same model folder (the batcher only for its tokenizer).
export TW_MODEL_DIR="${TW_MODEL_DIR:-$("$TW" model build --preset "${TW_MODEL_PRESET:-tiny}" 2>/dev/null | tail -n 1)}"

alive() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

start_service() {
  local name=$1
  if alive "$name"; then return; fi
  nohup "$TW" "$name" >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

stop_service() {
  local name=$1 pid
  alive "$name" || { rm -f "$PIDS/$name.pid"; return 0; }
  pid=$(cat "$PIDS/$name.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDS/$name.pid"
}

wait_ready() {
  # The edge answers /healthz and a worker heartbeat is in Redis.
  for _ in $(seq 1 300); do
    for s in "${SERVICES[@]}"; do
      alive "$s" || { echo "$s exited; last log lines:" >&2; tail -n 30 "$LOGS/$s.log" >&2; return 1; }
    done
    if curl -fs "http://127.0.0.1:$TW_EDGE_PORT/healthz" >/dev/null 2>&1 &&
       [ -n "$(redis-cli -p "$TW_REDIS_PORT" --scan --pattern "${TW_TOPIC_PREFIX:-tw}:hb:*" | head -n1)" ]; then
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
  redis-cli -p "$TW_REDIS_PORT" HSET "${TW_TOPIC_PREFIX:-tw}:apikeys" "$digest" dev >/dev/null
  echo "$key"
}

case "${1:-}" in
  up)
    infra/kafka.sh start
    infra/redis.sh start
    "$TW" topics create
    for s in "${SERVICES[@]}"; do start_service "$s"; done
    wait_ready
    echo "tokenwire ($TW_STACK) is serving at http://127.0.0.1:$TW_EDGE_PORT"
    echo "development API key (tenant dev): $(dev_key)  (send 'Authorization: Bearer <key>'; TW_AUTH=required makes keys mandatory)"
    ;;
  down)
    for s in edge batcher worker; do stop_service "$s"; done
    infra/redis.sh stop
    infra/kafka.sh stop
    ;;
  status)
    rc=0
    for s in "${SERVICES[@]}"; do
      if alive "$s"; then echo "$s: running (pid $(cat "$PIDS/$s.pid"))"; else echo "$s: stopped"; rc=1; fi
    done
    infra/kafka.sh status || rc=1
    infra/redis.sh status || rc=1
    exit $rc
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
