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
export TW_KAFKA_BOOTSTRAP="127.0.0.1:$TW_KAFKA_PORT"
export TW_REDIS_URL="redis://127.0.0.1:$TW_REDIS_PORT/0"
export TW_REQUESTS_PARTITIONS="${TW_REQUESTS_PARTITIONS:-4}"
export TW_BATCHES_PARTITIONS="${TW_BATCHES_PARTITIONS:-4}"
