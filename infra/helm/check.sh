#!/usr/bin/env bash
# Validate the Helm chart offline: `helm lint --strict`, `helm template` with the default
# values and with every optional part switched, and strict decoding of every rendered
# object into the Kubernetes API types (infra/helm/validate, whose own test shows it
# refuses a misspelt field). helm and the validator are built once from the Go module
# proxy into $TOKENWIRE_CACHE/helm (idempotent: a second run builds nothing).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
HELM_VERSION=v3.22.0  # served by the Go module proxy; bump with a check run
dir="$TOKENWIRE_CACHE/helm"
command -v go >/dev/null || { echo "infra/helm/check.sh: Go is needed to build helm" >&2; exit 1; }
export GOMODCACHE="$dir/gomod" GOCACHE="$dir/gocache" GOFLAGS=-mod=mod
mkdir -p "$dir/bin"

helm="$dir/bin/helm-$HELM_VERSION"
if [ ! -x "$helm" ]; then
  echo "building helm $HELM_VERSION into $dir (once)"
  GOBIN="$dir/build" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$dir/build/helm" "$helm"
fi

src="$TW_ROOT/infra/helm/validate"
sum="$(cat "$src"/*.go "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16)"
validate="$dir/bin/validate-$sum"
if [ ! -x "$validate" ]; then
  echo "building the validator (once per change of its source)"
  (cd "$src" && go vet ./... && go test ./... && go build -o "$validate.tmp" . && mv "$validate.tmp" "$validate")
fi

chart="$TW_ROOT/infra/helm/tokenwire"
"$helm" lint --strict "$chart"
variants=(
  ""
  "--set worker.keda.enabled=false --set edge.hpa.enabled=false --set serviceMonitor.enabled=false"
  "--set secrets.existingSecret=tokenwire --set redis.tlsCaSecret=redis-ca
   --set worker.modelVolume.persistentVolumeClaim.claimName=models
   --set worker.keda.authenticationRef=kafka-auth --set env.TW_LOG_LEVEL=DEBUG"
  "--set kafka.securityProtocol=SASL_SSL --set kafka.passwordSecret=kafka-users
   --set kafka.tlsCaSecret=kafka-ca"
  "--set kafka.securityProtocol=SSL --set kafka.clientCertSecrets.edge=edge-cert
   --set kafka.clientCertSecrets.batcher=batcher-cert --set kafka.clientCertSecrets.worker=worker-cert"
)
for v in "${variants[@]}"; do
  # shellcheck disable=SC2086
  "$helm" lint --strict "$chart" $v >/dev/null
  # shellcheck disable=SC2086
  "$helm" template tokenwire "$chart" $v | "$validate"
done
# SASL_SSL without a Secret of passwords is refused (the chart takes none as a value).
if out=$("$helm" template tokenwire "$chart" --set kafka.securityProtocol=SASL_SSL 2>&1); then
  echo "helm template accepted SASL_SSL without kafka.passwordSecret" >&2; exit 1
fi
grep -q "needs kafka.passwordSecret" <<<"$out" || { echo "$out" >&2; exit 1; }
echo "helm chart ok"
