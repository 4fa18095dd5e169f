# shellcheck shell=bash
# Sourced by the infra scripts: where caches, data and ports live. Every value can be
# overridden from the environment, so a test stack and a demo stack never collide.
TW_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TW_ROOT
export TOKENWIRE_CACHE="${TOKENWIRE_CACHE:-$HOME/.cache/tokenwire}"
export TW_STACK="${TW_STACK:-demo}"
export TW_RUN_DIR="${TW_RUN_DIR:-$TOKENWIRE_CACHE/run/$TW_STACK}"
if [ "$TW_STACK" = "test" ]; then
  export TW_KAFKA_PORT="${TW_KAFKA_PORT:-19092}"
  export TW_KAFKA_CONTROLLER_PORT="${TW_KAFKA_CONTROLLER_PORT:-19093}"
  export TW_REDIS_PORT="${TW_REDIS_PORT:-16379}"
  export TW_REDIS_PERSIST="${TW_REDIS_PERSIST:-off}"
  export TW_EDGE_PORT="${TW_EDGE_PORT:-18000}"
else
  export TW_KAFKA_PORT="${TW_KAFKA_PORT:-9092}"
  export TW_KAFKA_CONTROLLER_PORT="${TW_KAFKA_CONTROLLER_PORT:-9093}"
  export TW_REDIS_PORT="${TW_REDIS_PORT:-6379}"
  export TW_REDIS_PERSIST="${TW_REDIS_PERSIST:-aof}"
  export TW_EDGE_PORT="${TW_EDGE_PORT:-8000}"
fi
# The Kafka cluster profile: TW_KAFKA_BROKERS combined broker+controller nodes (infra/kafka.sh),
# node i on the i-th ports of TW_KAFKA_PORTS and TW_KAFKA_CONTROLLER_PORTS (comma-separated;
# by default two apart from TW_KAFKA_PORT and TW_KAFKA_CONTROLLER_PORT: 9092/9093, 9094/9095,
# ...). `infra/stack.sh up --brokers N` records N in the run folder for the stack's later
# commands. Three or more nodes replicate every topic 3 times, with 2 in sync for acks=all.
# Not exported (a test's private broker started from a shell that sourced this file must not
# inherit the shell's ports); the replication settings are, for `tokenwire topics create`.
if [ -z "${TW_KAFKA_BROKERS:-}" ] && [ -s "$TW_RUN_DIR/kafka-brokers" ]; then
  TW_KAFKA_BROKERS=$(cat "$TW_RUN_DIR/kafka-brokers")
fi
TW_KAFKA_BROKERS="${TW_KAFKA_BROKERS:-1}"
[[ "$TW_KAFKA_BROKERS" =~ ^[1-9]$ ]] || { echo "TW_KAFKA_BROKERS must be 1 to 9, not '$TW_KAFKA_BROKERS'" >&2; exit 2; }
if [ -z "${TW_KAFKA_PORTS:-}" ]; then
  TW_KAFKA_PORTS="" TW_KAFKA_CONTROLLER_PORTS=""
  for ((i = 0; i < TW_KAFKA_BROKERS; i++)); do
    TW_KAFKA_PORTS+="${TW_KAFKA_PORTS:+,}$((TW_KAFKA_PORT + 2 * i))"
    TW_KAFKA_CONTROLLER_PORTS+="${TW_KAFKA_CONTROLLER_PORTS:+,}$((TW_KAFKA_CONTROLLER_PORT + 2 * i))"
  done
fi
TW_KAFKA_PORT="${TW_KAFKA_PORTS%%,*}"
export TW_KAFKA_BOOTSTRAP="127.0.0.1:${TW_KAFKA_PORTS//,/,127.0.0.1:}"
if [ "$TW_KAFKA_BROKERS" -ge 3 ]; then
  export TW_KAFKA_REPLICATION_FACTOR="${TW_KAFKA_REPLICATION_FACTOR:-3}"
  export TW_KAFKA_MIN_INSYNC_REPLICAS="${TW_KAFKA_MIN_INSYNC_REPLICAS:-2}"
elif [ "$TW_KAFKA_BROKERS" -eq 2 ]; then
  export TW_KAFKA_REPLICATION_FACTOR="${TW_KAFKA_REPLICATION_FACTOR:-2}"
fi
# The Redis Cluster profile: TW_REDIS_SHARDS masters (3 or more; 1: one plain node), each
# with TW_REDIS_REPLICAS replicas (infra/redis.sh), on the ports of TW_REDIS_PORTS (by
# default consecutive from TW_REDIS_PORT). `infra/stack.sh up --redis-cluster N` records N
# in the run folder for the stack's later commands. Not exported, as TW_KAFKA_BROKERS.
if [ -z "${TW_REDIS_SHARDS:-}" ] && [ -s "$TW_RUN_DIR/redis-shards" ]; then
  TW_REDIS_SHARDS=$(cat "$TW_RUN_DIR/redis-shards")
fi
TW_REDIS_SHARDS="${TW_REDIS_SHARDS:-1}"
[[ "$TW_REDIS_SHARDS" =~ ^[1-9][0-9]?$ ]] && [ "$TW_REDIS_SHARDS" != 2 ] ||
  { echo "TW_REDIS_SHARDS must be 1 (one node) or 3 to 99, not '$TW_REDIS_SHARDS'" >&2; exit 2; }
[ -z "${TW_REDIS_PORTS:-}" ] || TW_REDIS_PORT="${TW_REDIS_PORTS%%,*}"
# A cluster's clients take any node's URL: they learn the others from it.
export TW_REDIS_URL="redis://127.0.0.1:$TW_REDIS_PORT/0"
export TW_REQUESTS_PARTITIONS="${TW_REQUESTS_PARTITIONS:-4}"
export TW_BATCHES_PARTITIONS="${TW_BATCHES_PARTITIONS:-4}"
