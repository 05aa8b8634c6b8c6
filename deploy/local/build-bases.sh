#!/usr/bin/env bash
# The two base images deploy/compose.local.yml builds on, made here from Debian's packages, with no registry:
#
#   crewwork-local/debian:bookworm       a minimal Debian 12 (mmdebstrap, then `docker import`)
#   crewwork-local/python:3.11-bookworm  that plus Debian's python3.11 and venv (deploy/local/python/Dockerfile)
#
#   deploy/local/build-bases.sh [--rebuild]
#
# Idempotent: an image already in the engine is kept unless --rebuild. Needs root (mmdebstrap is installed from
# Debian's packages if missing), a Docker engine, and Debian's archive (the only network it uses).
set -euo pipefail
cd "$(dirname "$0")"

DEBIAN=crewwork-local/debian:bookworm
PYTHON=crewwork-local/python:3.11-bookworm
MIRROR="${CREWWORK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY="${CREWWORK_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
rebuild=0
[ "${1:-}" = --rebuild ] && rebuild=1

have() { docker image inspect "$1" >/dev/null 2>&1; }

if [ "$rebuild" = 1 ] || ! have "$DEBIAN"; then
    if ! command -v mmdebstrap >/dev/null; then
        echo "build-bases: installing mmdebstrap"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq mmdebstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq mmdebstrap >/dev/null; }
    fi
    echo "build-bases: $DEBIAN from $MIRROR (mmdebstrap, ~1.5 min)"
    start=$(date +%s)
    # --variant=apt: essential packages plus apt, so the images built on it install what they need with apt-get.
    mmdebstrap --quiet --variant=apt --include=ca-certificates --format=tar bookworm - \
        "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main" \
        | docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$DEBIAN" >/dev/null
    echo "build-bases: $DEBIAN in $(( $(date +%s) - start )) s"
fi

if [ "$rebuild" = 1 ] || ! have "$PYTHON"; then
    start=$(date +%s)
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' EXIT
    cp python/Dockerfile "$ctx/"
    mkdir "$ctx/extra-ca"
    # The host's own CAs (a package mirror or egress proxy with a private CA), so pip in the images trusts what the
    # host trusts. None: an empty directory.
    find /usr/local/share/ca-certificates -maxdepth 1 -name '*.crt' -exec cp {} "$ctx/extra-ca/" \; 2>/dev/null || true
    # The engine here may run without its default bridge network: builds use the host's network for apt.
    DOCKER_BUILDKIT=0 docker build -q --network=host -t "$PYTHON" "$ctx" 2>&1 >/dev/null \
        | grep -v -e DEPRECATED -e BuildKit -e "^ *environment-variable" -e "^$" || true
    have "$PYTHON" || { echo "build-bases: building $PYTHON failed" >&2; exit 1; }
    echo "build-bases: $PYTHON in $(( $(date +%s) - start )) s"
fi
echo "build-bases: ready ($DEBIAN, $PYTHON)"
