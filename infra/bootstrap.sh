#!/usr/bin/env bash
# Idempotent set-up of everything tokenwire needs on a fresh Debian machine:
# Debian packages, the Python virtual environment (cached outside the checkout and
# rebuilt only when the dependency list changes), the Kafka jars, and the default model.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$TW_ROOT"
mkdir -p "$TOKENWIRE_CACHE"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------
need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ "${TW_WITH_TEST_TOOLS:-0}" = 1 ]; then
  command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# --- Python virtual environment ---------------------------------------------------
PY="${TW_PYTHON:-python3}"
# FAISS: the GPU build where a CUDA driver answers, the CPU build elsewhere (TW_FAISS overrides).
if [ -z "${TW_FAISS:-}" ]; then
  if nvidia-smi >/dev/null 2>&1; then TW_FAISS=gpu; else TW_FAISS=cpu; fi
fi
export TW_FAISS
requirements() {  # $1: "deps" (installed with their dependencies) or "no-deps"
  "$PY" - "$1" <<'PY'
import os, sys, tomllib
t = tomllib.load(open("pyproject.toml", "rb"))
p, extras = t["project"], t["project"]["optional-dependencies"]
if sys.argv[1] == "deps":
    print("\n".join(p["dependencies"] + extras["dev"] + extras[os.environ["TW_FAISS"]]))
else:
    print("\n".join(t["tool"]["tokenwire"]["no-deps"]))
PY
}
# The ranges are installed within the tested versions of infra/constraints.txt;
# TW_RELOCK=1 resolves them afresh (a new environment) and writes the versions it got there
# (the next plain run then builds the environment of that file once more: a venv cannot be
# moved). The file is written from the CPU build of FAISS, whose pin it holds.
CONSTRAINTS=infra/constraints.txt
relock="${TW_RELOCK:-0}"
if [ "$relock" = 1 ]; then
  [ "$TW_FAISS" = cpu ] || { log "TW_RELOCK=1 needs TW_FAISS=cpu (the file pins faiss-cpu)"; exit 2; }
  CONSTRAINTS=/dev/null
fi
deps_hash=$( { requirements deps | sort; echo --no-deps; requirements no-deps | sort; "$PY" -V
  cat "$CONSTRAINTS"; } | sha256sum | cut -c1-16)
VENV="$TOKENWIRE_CACHE/venv-$deps_hash"
[ "$relock" != 1 ] || rm -f "$VENV/.complete"
if [ ! -f "$VENV/.complete" ]; then
  log "building virtual environment $VENV (first run only: torch is large)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools
  "$VENV/bin/pip" install -q -c "$CONSTRAINTS" -r <(requirements deps)
  "$VENV/bin/pip" install -q --no-deps -c "$CONSTRAINTS" -r <(requirements no-deps)
  touch "$VENV/.complete"
  # Environments of older dependency lists are ~6 GB each: keep only the current one.
  find "$TOKENWIRE_CACHE" -maxdepth 1 -name 'venv-*' ! -path "$VENV" -exec rm -rf {} + || true
fi
ln -sfn "$VENV" .venv
if [ "$relock" = 1 ]; then
  { sed -n '/^#/p' infra/constraints.txt; "$VENV/bin/pip" freeze --exclude-editable; } \
    > infra/constraints.txt.new
  mv infra/constraints.txt.new infra/constraints.txt
  log "wrote the versions installed to infra/constraints.txt"
fi
# The project itself is installed editable from this checkout (seconds), so the cached
# environment always runs the code of the checkout that bootstrapped last. Setuptools warns
# on every editable build that a folder named like the package may shadow it (here it is
# the package): this call's Python warnings are silenced; errors still show.
PYTHONWARNINGS=ignore "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e . >/dev/null

# --- Kafka jars from Maven Central --------------------------------------------------
pom_hash=$(sha256sum infra/kafka/pom.xml | cut -c1-16)
KAFKA_LIBS="$TOKENWIRE_CACHE/kafka-$pom_hash"
if [ ! -f "$KAFKA_LIBS/.complete" ]; then
  log "fetching Kafka jars into $KAFKA_LIBS"
  rm -rf "$KAFKA_LIBS"
  mvn -q -B -f infra/kafka/pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS"
  touch "$KAFKA_LIBS/.complete"
fi
ln -sfn "$KAFKA_LIBS" "$TOKENWIRE_CACHE/kafka-libs"

# --- the default model -------------------------------------------------------------
.venv/bin/tokenwire model build --preset "${TW_MODEL_PRESET:-tiny}" >&2
log "ready"
