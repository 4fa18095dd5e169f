#!/usr/bin/env bash
# Debian's redis-server on 127.0.0.1 for the demo and test stacks. Idempotent verbs:
#   infra/redis.sh start|stop|status|config
#   infra/redis.sh start|stop|kill|status|config NODE    (one node of a cluster, from 1)
#   infra/redis.sh nodes    (a cluster: one line per node, see `nodes` below)
# TW_REDIS_PERSIST=off: nothing on disk (tests); aof: append-only file (demo).
# TW_REDIS_MAXMEMORY: the memory cap (default 1gb; a cluster: of each node).
# TW_REDIS_ACL=on: one ACL user per service, from infra/redis-acl.conf, passwords in
#   TW_REDIS_ACL_DIR (default $TW_RUN_DIR/redis-acl: <user>.password, made when missing,
#   0600); the default user is off and this script logs in as tw-admin.
# TW_REDIS_TLS=on: the port speaks TLS only, with TW_REDIS_SERVER_CERT_FILE and
#   TW_REDIS_SERVER_KEY_FILE, client certificates (optional) checked against
#   TW_REDIS_TLS_CA_FILE, which this script's own redis-cli trusts.
# `config` prints the configuration `start` writes, and starts nothing.
#
# TW_REDIS_SHARDS=N (3 or more; unset, empty or 1: the single node above): a Redis Cluster
#   of N masters with TW_REDIS_REPLICAS (default 1) replicas each, N*(1+replicas) nodes on
#   the ports of TW_REDIS_PORTS (default: consecutive from TW_REDIS_PORT), node i's cluster
#   bus on the i-th port of TW_REDIS_BUS_PORTS (default: each port + 20000; Redis's own
#   +10000 would put the demo cluster's bus on the test stack's port). Node i lives in
#   $TW_RUN_DIR/redis/node-i (config, pid, log, nodes.conf, AOF). The first `start` forms
#   the cluster (`redis-cli --cluster create`) and waits until every node says
#   cluster_state:ok with all 16384 slots served; later starts leave a formed cluster as
#   it is, and a node started again rejoins from its nodes.conf. `kill NODE` is a SIGKILL
#   (a crash): after TW_REDIS_CLUSTER_NODE_TIMEOUT_MS (default 2000) without an answer a
#   master's replica takes over its slots. `infra/stack.sh up --redis-cluster N` keeps N in
#   $TW_RUN_DIR/redis-shards, so every later verb acts on the same nodes. Starting over
#   with another shape: `infra/redis.sh stop`, then delete $TW_RUN_DIR/redis.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
TW_REDIS_ACL="${TW_REDIS_ACL:-off}"
TW_REDIS_TLS="${TW_REDIS_TLS:-off}"
TW_REDIS_ACL_DIR="${TW_REDIS_ACL_DIR:-$TW_RUN_DIR/redis-acl}"

# A replay log takes at least 4.5 KB, however short (measured: a stream's first node is
# allocated whole), so 1gb holds the logs of about 200,000 requests: the last hour's (their
# TTL) at 55 requests/s. The test suite's many short requests alone filled 250 MB.
TW_REDIS_MAXMEMORY="${TW_REDIS_MAXMEMORY:-1gb}"
# Any other value used to mean "off" silently: a typo must not cost the demo its AOF.
case "$TW_REDIS_PERSIST" in
  off | aof) ;;
  *) printf '[redis:%s] TW_REDIS_PERSIST must be off or aof, not "%s"\n' "$TW_STACK" "$TW_REDIS_PERSIST" >&2; exit 2 ;;
esac
for v in TW_REDIS_ACL TW_REDIS_TLS; do
  case "${!v}" in
    off | on) ;;
    *) printf '[redis:%s] %s must be off or on, not "%s"\n' "$TW_STACK" "$v" "${!v}" >&2; exit 2 ;;
  esac
done

SHARDS=$TW_REDIS_SHARDS
REPLICAS="${TW_REDIS_REPLICAS:-1}"
NODE_TIMEOUT_MS="${TW_REDIS_CLUSTER_NODE_TIMEOUT_MS:-2000}"
NODE=1
log() { printf '[redis:%s%s] %s\n' "$TW_STACK" "$([ "$SHARDS" = 1 ] || echo ":$NODE")" "$*" >&2; }

if [ "$SHARDS" = 1 ]; then
  COUNT=1 PORTS=("$TW_REDIS_PORT") BUS_PORTS=(0)
else
  [[ "$REPLICAS" =~ ^[0-9]$ ]] || { log "TW_REDIS_REPLICAS must be 0 to 9, not '$REPLICAS'"; exit 2; }
  [[ "$NODE_TIMEOUT_MS" =~ ^[1-9][0-9]*$ ]] ||
    { log "TW_REDIS_CLUSTER_NODE_TIMEOUT_MS must be a positive number of ms, not '$NODE_TIMEOUT_MS'"; exit 2; }
  COUNT=$((SHARDS * (1 + REPLICAS)))
  if [ -n "${TW_REDIS_PORTS:-}" ]; then
    IFS=, read -ra PORTS <<<"$TW_REDIS_PORTS"
  else
    PORTS=()
    for ((i = 0; i < COUNT; i++)); do PORTS+=($((TW_REDIS_PORT + i))); done
  fi
  if [ -n "${TW_REDIS_BUS_PORTS:-}" ]; then
    IFS=, read -ra BUS_PORTS <<<"$TW_REDIS_BUS_PORTS"
  else
    BUS_PORTS=()
    for p in "${PORTS[@]}"; do BUS_PORTS+=($((p + 20000))); done
  fi
  if [ "${#PORTS[@]}" != "$COUNT" ] || [ "${#BUS_PORTS[@]}" != "$COUNT" ]; then
    log "$SHARDS shards with $REPLICAS replicas each are $COUNT nodes: TW_REDIS_PORTS (${PORTS[*]}) and TW_REDIS_BUS_PORTS (${BUS_PORTS[*]}) need as many ports"
    exit 2
  fi
  for p in "${PORTS[@]}" "${BUS_PORTS[@]}"; do
    [[ "$p" =~ ^[1-9][0-9]*$ ]] && ((p < 65536)) || { log "'$p' is not a port"; exit 2; }
  done
fi

# Node $1's folder and ports; a single node keeps its folder of old.
select_node() {
  NODE=$1
  PORT=${PORTS[NODE - 1]}
  BUS_PORT=${BUS_PORTS[NODE - 1]}
  if [ "$SHARDS" = 1 ]; then DIR="$TW_RUN_DIR/redis"; else DIR="$TW_RUN_DIR/redis/node-$NODE"; fi
  CONF="$DIR/redis.conf"
  PIDFILE="$DIR/redis.pid"
}
select_node 1

# redis-cli's options as this script needs them: over TLS, and as tw-admin, when those are on.
cli_auth() {
  CLI=()
  [ "$TW_REDIS_TLS" = on ] && CLI+=(--tls --cacert "$TW_REDIS_TLS_CA_FILE")
  [ "$TW_REDIS_ACL" = on ] &&
    CLI+=(--user tw-admin --pass "$(cat "$TW_REDIS_ACL_DIR/tw-admin.password")" --no-auth-warning)
  return 0
}
rcli() { cli_auth; redis-cli -p "$PORT" "${CLI[@]}" "$@"; }
answers() { [ "$(rcli ping 2>/dev/null)" = PONG ]; }

# A user's password file, made when missing (kept: services read it).
password_file() {
  if [ ! -s "$TW_REDIS_ACL_DIR/$1.password" ]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TW_REDIS_ACL_DIR/$1.password")
  fi
  echo "$TW_REDIS_ACL_DIR/$1.password"
}

# The users of infra/redis-acl.conf as an ACL file, passwords stored here as SHA-256 only.
acl_file() {
  local user hash rules
  mkdir -p "$TW_REDIS_ACL_DIR" && chmod 700 "$TW_REDIS_ACL_DIR"
  echo "user default off"
  for user in $(grep -Ev '^[[:space:]]*(#|$)' "$TW_ROOT/infra/redis-acl.conf" | awk '{print $1}' | awk '!seen[$0]++'); do
    hash=$(tr -d '\n' <"$(password_file "$user")" | sha256sum | cut -d' ' -f1)
    rules=$(awk -v u="$user" '$1 == u { $1 = ""; printf "%s", $0 }' "$TW_ROOT/infra/redis-acl.conf")
    echo "user $user on #$hash resetkeys resetchannels -@all$rules"
  done
}

# kill -0 also succeeds on a zombie: an exited daemon waits for its reaper (PID 1, which
# can be slow in containers), so a process counts as alive only if it is not one.
alive() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$st" != Z ]; }

# The pid file outlives crashes: trust it only while that pid is a redis-server on our port
# (redis sets its process title to "redis-server 127.0.0.1:PORT").
running_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "^redis-server .*:$PORT " || return 1
  echo "$pid"
}

# A cluster node's settings. The bus carries gossip and failover votes (over TLS too when
# the client port is TLS); a replica copies its master over a client connection, which with
# ACLs on logs in as tw-replica (its password in a 0600 file the config includes).
cluster_config() {
  [ "$SHARDS" != 1 ] || return 0
  cat <<EOF
cluster-enabled yes
cluster-config-file $DIR/nodes.conf
cluster-port $BUS_PORT
# A master silent this long is failed over to its replica: seconds, not the default 15 s.
cluster-node-timeout $NODE_TIMEOUT_MS
# A request's keys share one slot (their hash tag), so a shard that is down stops only the
# requests whose slots it serves; with full coverage required every node would refuse
# every command (CLUSTERDOWN) until a failover ends, or for good once a shard has no node
# left, and the streams on the healthy shards would stop with it.
cluster-require-full-coverage no
# A replica copies its master through a file, not a socket. After a diskless copy the
# master streams writes to the replica only from the replica's first acknowledgement, up
# to a second after the replica reports itself in sync: a master lost in that second took
# acknowledged writes with it (replay-log entries the promoted replica never had), and the
# writers' WAIT for a replica (200 ms) did not cover it. After a file the master streams
# at once. The file is deleted once sent (no RDB snapshots are kept).
repl-diskless-sync no
rdb-del-sync-files yes
EOF
  if [ "$TW_REDIS_TLS" = on ]; then printf 'tls-cluster yes\ntls-replication yes\n'; fi
  if [ "$TW_REDIS_ACL" = on ]; then echo "include $DIR/replication.conf"; fi
}

config() {
  # RDB snapshots are off in both modes: the tokens' replay log is short-lived, and the
  # demo's durability comes from the AOF alone. everysec: a write reaches the file (the
  # kernel's page cache) before it is acknowledged and is fsynced within about a second;
  # README, "What a crash can lose", says what that means for each key.
  local persist='appendonly no'
  [ "$TW_REDIS_PERSIST" = aof ] && persist=$'appendonly yes\nappendfsync everysec'
  local listen="port $PORT"
  if [ "$TW_REDIS_TLS" = on ]; then
    listen="port 0
tls-port $PORT
tls-cert-file $TW_REDIS_SERVER_CERT_FILE
tls-key-file $TW_REDIS_SERVER_KEY_FILE
tls-ca-cert-file $TW_REDIS_TLS_CA_FILE
tls-auth-clients optional"
  fi
  [ "$TW_REDIS_ACL" = on ] && listen+=$'\n'"aclfile $DIR/users.acl"
  cat <<EOF
# Generated by infra/redis.sh on each start; edit the script, not this file.
bind 127.0.0.1
$listen
protected-mode yes
daemonize yes
pidfile $PIDFILE
logfile $DIR/redis.log
dir $DIR
save ""
$persist
# An explicit cap, so a flood fails loudly here instead of the machine swapping. Never
# evict: every per-request key carries a TTL (replay logs, claims, done markers, owners,
# cancel flags; rate buckets and heartbeats too), so a volatile-* policy would evict exactly
# the keys the hand-off guarantees rest on (an evicted claim lets a second worker write
# the same stream, an evicted replay log loses what a resuming client needs, an evicted
# done marker has a request generated again), and allkeys-* would also drop the API keys.
# With noeviction a write past the cap is refused with an OOM error its writer sees, and
# memory frees itself as the TTLs pass (a replay log lives 1 h after its last event).
maxmemory $TW_REDIS_MAXMEMORY
maxmemory-policy noeviction
EOF
  cluster_config
}

install_redis() {
  command -v redis-server >/dev/null && return
  log "installing redis-server"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
}

# Write node $NODE's files and start its daemon; it answers PING when this returns.
start_node() {
  mkdir -p "$DIR"
  if [ "$TW_REDIS_ACL" = on ]; then
    (umask 077; acl_file >"$DIR/users.acl")
    if [ "$SHARDS" != 1 ]; then
      (umask 077; printf 'masteruser tw-replica\nmasterauth %s\n' \
        "$(cat "$(password_file tw-replica)")" >"$DIR/replication.conf")
    fi
  fi
  config >"$CONF"
  redis-server "$CONF"
  for _ in $(seq 100); do answers && { log "ready on 127.0.0.1:$PORT"; return; }; sleep 0.1; done
  log "no PONG on port $PORT after 10 s; end of $DIR/redis.log:"
  tail -n 20 "$DIR/redis.log" >&2 || true
  exit 1
}

# Start the given nodes (each running one is left as it is); a whole cluster is formed
# once, and each node started waits until it sees every slot served.
start() {
  local i
  install_redis
  for i in "$@"; do
    select_node "$i"
    if answers; then
      running_pid >/dev/null && { log "already running"; continue; }
      log "port $PORT is served by another process"; exit 1
    fi
    start_node
  done
  [ "$SHARDS" = 1 ] && return
  [ $# != "$COUNT" ] || form_once
  for i in "$@"; do select_node "$i"; wait_served; done
  wait_agreed
}

# One field of a node's CLUSTER INFO.
cluster_info() { rcli cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$1://p"; }

# `redis-cli --cluster create` once: only while no node knows another and no slot is
# assigned. A node that lost its nodes.conf beside a formed cluster is not added back
# silently (which slots or master it should take would be a guess).
form_once() {
  local i fresh=0 known addrs=() out
  for ((i = 1; i <= COUNT; i++)); do
    select_node "$i"
    known=$(cluster_info cluster_known_nodes)
    if [ "$known" = 1 ] && [ "$(cluster_info cluster_slots_assigned)" = 0 ]; then
      fresh=$((fresh + 1))
    elif [ "$known" != "$COUNT" ]; then
      log "knows $known nodes, not $COUNT: the cluster in $TW_RUN_DIR/redis was formed with other TW_REDIS_SHARDS or TW_REDIS_REPLICAS; stop it and delete that folder to start over"
      exit 1
    fi
    addrs+=("127.0.0.1:$PORT")
  done
  [ "$fresh" = 0 ] && return
  select_node 1
  if [ "$fresh" != "$COUNT" ]; then
    log "$fresh of $COUNT nodes are in no cluster (a node's folder lost?): stop the cluster and delete $TW_RUN_DIR/redis to start over"
    exit 1
  fi
  cli_auth
  out=$(redis-cli "${CLI[@]}" --cluster create "${addrs[@]}" --cluster-replicas "$REPLICAS" --cluster-yes 2>&1) ||
    { log "redis-cli --cluster create failed:"; printf '%s\n' "$out" >&2; exit 1; }
  printf '%s\n' "$out" >"$TW_RUN_DIR/redis/cluster-create.log"
  log "formed a cluster of $SHARDS masters with $REPLICAS replicas each"
}

# Ready: the node says the cluster is ok with every slot served by a live master, and a
# replica has its master's data (until then it cannot take over: a replica that never
# synced refuses a failover).
served() {
  [ "$(cluster_info cluster_state)" = ok ] && [ "$(cluster_info cluster_slots_ok)" = 16384 ] || return 1
  rcli info replication 2>/dev/null | tr -d '\r' | grep -qx 'role:master\|master_link_status:up'
}

# Wait until node $NODE is ready (served).
wait_served() {
  local t0=$EPOCHREALTIME limit=${TW_REDIS_START_TIMEOUT:-30}
  local deadline=$((SECONDS + limit))
  until served; do
    if [ $SECONDS -ge $deadline ]; then
      log "not ready after $limit s; as this node sees the cluster:"
      rcli cluster info >&2 || true
      rcli info replication >&2 || true
      exit 1
    fi
    sleep 0.1
  done
  log "every slot served ($(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME-$t0}") s)"
}

# A node's view of the cluster, in words every node would use alike: each node's id, role,
# master, whether it is down, and its slots.
view() {
  rcli cluster nodes 2>/dev/null | tr -d '\r' | awk '{
    s = ""; for (k = 9; k <= NF; k++) if ($k !~ /^\[/) s = s " " $k
    print $1, ($3 ~ /master/ ? "master" : "replica"), $4, ($3 ~ /fail/ ? "down" : "up") s }' | sort
}

# Wait until every running node sees the same cluster: gossip spreads a change (a new
# replica, a failover, a node back) a node at a time, and `nodes` asks only one of them.
wait_agreed() {
  local i first views deadline=$((SECONDS + ${TW_REDIS_START_TIMEOUT:-30}))
  while :; do
    first="" views=same
    for ((i = 1; i <= COUNT; i++)); do
      select_node "$i"
      running_pid >/dev/null || continue
      if [ -z "$first" ]; then first=$(view); elif [ "$(view)" != "$first" ]; then views=differ; break; fi
    done
    [ "$views" = differ ] || return 0
    if [ $SECONDS -ge $deadline ]; then
      log "the nodes still see the cluster differently after ${TW_REDIS_START_TIMEOUT:-30} s"
      exit 1
    fi
    sleep 0.1
  done
}

# Stop the given nodes, all at once: one by one, a master's replica could take over (after
# the node timeout) while the master waits for its turn.
stop() {
  local i pid how=nosave stopping=() up
  [ "$TW_REDIS_PERSIST" = aof ] && how=''   # plain SHUTDOWN fsyncs the AOF
  for i in "$@"; do
    select_node "$i"
    pid=$(running_pid) || { rm -f "$PIDFILE"; continue; }
    # shellcheck disable=SC2086 # $how: no word at all when empty
    (rcli shutdown $how >/dev/null 2>&1 || kill -TERM "$pid") &
    stopping+=("$i:$pid")
  done
  for _ in $(seq 100); do
    up=0
    for i in "${stopping[@]}"; do alive "${i#*:}" && up=1; done
    [ "$up" = 1 ] || break
    sleep 0.1
  done
  for i in "${stopping[@]}"; do
    select_node "${i%%:*}"
    if alive "${i#*:}"; then log "still up after 10 s, killing"; kill -KILL "${i#*:}"; fi
    rm -f "$PIDFILE"
    log "stopped"
  done
  wait
}

# SIGKILL of one node (a crash, for fault tests): no shutdown, no goodbye to the cluster.
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
  for i in "$@"; do
    select_node "$i"
    running_pid >/dev/null && answers || return 1
    [ "$SHARDS" = 1 ] || [ "$(cluster_info cluster_state)" = ok ] || return 1
  done
}

# One line per node, as the first node that answers sees the cluster:
#   NODE PORT ROLE STATE SLOTS MASTER
# ROLE: master or replica. STATE: up, suspect (silent past the node timeout, as this node
# sees it) or down (the cluster agreed it failed). SLOTS: the ranges a master serves
# (0-5460,10923), or -. MASTER: a replica's master's port, or -. A node the cluster does
# not know: "NODE PORT - - - -".
nodes_verb() {
  local i table=""
  for ((i = 1; i <= COUNT; i++)); do
    select_node "$i"
    table=$(rcli cluster nodes 2>/dev/null | tr -d '\r') && [ -n "$table" ] && break
  done
  [ -n "$table" ] || { log "no node answers"; exit 1; }
  printf '%s\n' "$table" | awk -v ports="${PORTS[*]}" '
    { split($2, addr, "[:@]"); port[$1] = addr[2]; flags[$1] = $3; master[$1] = $4
      s = ""; for (k = 9; k <= NF; k++) if ($k !~ /^\[/) s = s (s == "" ? "" : ",") $k
      slots[$1] = (s == "" ? "-" : s); id[addr[2]] = $1 }
    END {
      n = split(ports, list, " ")
      for (i = 1; i <= n; i++) {
        p = list[i]
        if (!(p in id)) { print i, p, "-", "-", "-", "-"; continue }
        x = id[p]
        role = (flags[x] ~ /master/) ? "master" : "replica"
        state = (flags[x] ~ /fail\?/) ? "suspect" : ((flags[x] ~ /fail/) ? "down" : "up")
        print i, p, role, state, slots[x], (master[x] == "-" ? "-" : port[master[x]])
      }
    }'
}

# The nodes a verb acts on: the one named (from 1), or every node.
which_nodes() {
  if [ -z "${1:-}" ]; then seq 1 "$COUNT"; return; fi
  [[ "$1" =~ ^[1-9][0-9]*$ ]] && (($1 <= COUNT)) || { log "no node '$1' ($COUNT nodes)"; exit 2; }
  echo "$1"
}

verb=${1:-}
[ $# = 0 ] || shift
case "$verb" in
  start) ns=$(which_nodes "${1:-}"); start $ns ;;
  stop) ns=$(which_nodes "${1:-}"); stop $ns ;;
  kill)
    [ -n "${1:-}" ] || [ "$COUNT" = 1 ] || { log "kill needs a node (1-$COUNT)"; exit 2; }
    ns=$(which_nodes "${1:-1}"); kill_node "$ns" ;;
  status) ns=$(which_nodes "${1:-}"); status $ns ;;
  config) ns=$(which_nodes "${1:-1}"); select_node "$ns"; config ;;
  nodes) [ "$SHARDS" != 1 ] || { log "not a cluster (TW_REDIS_SHARDS=1)"; exit 2; }; nodes_verb ;;
  *) echo "usage: $0 start|stop|status|config [NODE] | kill NODE | nodes" >&2; exit 2 ;;
esac
