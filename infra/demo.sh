#!/usr/bin/env bash
# Set everything up (idempotent), start the whole stack on the embedded default model,
# stream a sample answer, and keep serving until Ctrl-C (or `infra/demo.sh stop`).
#   infra/demo.sh [--detach] ["prompt"] | stop
set -euo pipefail
export TW_STACK=demo
# The demo alone serves calls without a key (as tenant "default"), so its commands and the
# chat page work with no extra step; its development key still selects tenant "dev".
# Every other deployment requires keys (the edge's default).
export TW_AUTH="${TW_AUTH:-off}"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$TW_ROOT"

if [ "${1:-}" = "stop" ]; then exec infra/stack.sh down; fi
detach=0
if [ "${1:-}" = "--detach" ]; then detach=1; shift; fi
prompt="${1:-The function returns}"

bash infra/bootstrap.sh
infra/stack.sh up
echo
echo "Streaming a sample answer through Kafka → batcher → worker → Redis → edge:"
echo "> $prompt"
.venv/bin/tokenwire ask --url "http://127.0.0.1:$TW_EDGE_PORT" "$prompt"
echo
echo "OpenAI-compatible API: http://127.0.0.1:$TW_EDGE_PORT/v1  (model: tokenwire-tiny)"
echo "Development API key:   $(cat "$TW_RUN_DIR/dev-api-key")"
echo "Chat page:             http://127.0.0.1:$TW_EDGE_PORT/chat"
echo "Try:  .venv/bin/tokenwire ask --url http://127.0.0.1:$TW_EDGE_PORT \"Return the\""
if [ "$detach" = 1 ]; then
  echo "Stop with: infra/demo.sh stop"
  exit 0
fi
echo "Serving; press Ctrl-C to stop everything."
trap 'echo; infra/stack.sh down; exit 0' INT TERM
# The services wait out a Kafka or Redis outage and their supervisors restart them when
# they exit, so a failed check is reported (once, and its end), not acted on: ending the
# demo then would turn a blip into an outage. It ends on Ctrl-C or `infra/demo.sh stop`.
healthy=1
while :; do
  if ! compgen -G "$TW_RUN_DIR/pids/*.supervisor.pid" >/dev/null; then
    echo "the stack was stopped"
    exit 0
  fi
  if report=$(infra/stack.sh status 2>&1); then
    [ "$healthy" = 1 ] || echo "[demo] everything is up again"
    healthy=1
  elif [ "$healthy" = 1 ]; then
    healthy=0
    echo "[demo] not everything is up (logs: $TW_RUN_DIR/logs):" >&2
    grep -v ': running' <<<"$report" >&2 || true
  fi
  sleep 2
done
