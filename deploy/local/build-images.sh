#!/usr/bin/env bash
# Every image of the compose stack built here (deploy/compose.local.yml), no registry: the base images
# (build-bases.sh), then `docker compose build` of the stack. Idempotent; a second run is a cache hit (seconds).
#
#   deploy/local/build-images.sh
#
# scripts/test-env.sh runs it at install time, so tests/deploy/test_compose_stack.py only finds the images cached.
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/local/build-bases.sh
start=$(date +%s)
# The passwords are required by docker-compose.yml's interpolation, and unused by a build.
COMPOSE_BAKE=false POSTGRES_PASSWORD=build TEMPORAL_DB_PASSWORD=build CREWWORK_DB_PASSWORD=build \
    docker compose -f docker-compose.yml -f deploy/compose.local.yml build --quiet
echo "build-images: the stack's images in $(( $(date +%s) - start )) s"
