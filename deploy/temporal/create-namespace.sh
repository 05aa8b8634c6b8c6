#!/bin/sh
# Registers the namespace crewwork uses and crewwork's search attributes (the same ones the embedded dev server
# declares in crewwork/temporal/devserver.py). Idempotent: existing ones are left alone.
set -eu

NS="${CREWWORK_TEMPORAL_NAMESPACE:-default}"
RETENTION="${TEMPORAL_NAMESPACE_RETENTION:-30d}"

until temporal operator cluster health --address "${TEMPORAL_ADDRESS}" >/dev/null 2>&1; do
    echo "waiting for Temporal at ${TEMPORAL_ADDRESS}"
    sleep 1
done

temporal operator namespace describe --namespace "$NS" >/dev/null 2>&1 \
    || temporal operator namespace create --namespace "$NS" --retention "$RETENTION"

for sa in CrewworkState CrewworkKind CrewworkTenant CrewworkRepo; do
    temporal operator search-attribute create --namespace "$NS" --name "$sa" --type Keyword >/dev/null 2>&1 || true
done
temporal operator search-attribute list --namespace "$NS" | grep -q CrewworkState
echo "namespace $NS is ready"
