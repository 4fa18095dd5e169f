#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite against a real Kafka and
# Redis (the test stack: its own ports and folders, wiped first), then lint and type-check.
# Extra arguments go to pytest, e.g. `infra/test.sh tests/unit -x`.
set -euo pipefail
export TW_STACK=test
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$TW_ROOT"
TW_WITH_TEST_TOOLS=1 bash infra/bootstrap.sh

cleanup() { infra/redis.sh stop >/dev/null 2>&1 || true; infra/kafka.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
TW_KAFKA_WIPE=1 infra/kafka.sh start
infra/redis.sh start

rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || rc=$?
echo "--- lint and types"
.venv/bin/ruff check shared services tests || rc=1
.venv/bin/ruff format --check shared services tests || rc=1
.venv/bin/mypy || rc=1
.venv/bin/tokenwire schema --check || rc=1
echo "--- helm chart"
bash infra/helm/check.sh || rc=1
exit $rc
