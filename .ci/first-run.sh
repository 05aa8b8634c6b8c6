#!/usr/bin/env bash
# The newcomer's first run, proved: the README's first command (`make demo`) on a machine made to look fresh, in a
# fresh clone. A regression of that path fails CI instead of a newcomer's first hour. Needs root (as CI runs).
#
# Fresh means what a new machine of this kind lacks: bubblewrap (removed here; `make demo` must install it again),
# a reachable Docker engine (DOCKER_HOST points at nothing: a docker client, no engine), any cached environment
# (a clone of the committed tree into a temporary directory: no .venv, no .cache, no .crewwork) and any CREWWORK_*
# setting (a clean environment: PATH, HOME, LANG only). The pip download cache under HOME is kept: it changes how
# long the install takes, not whether it works.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "first-run: must run as root (it removes bubblewrap)" >&2; exit 1; }
if dpkg -s bubblewrap >/dev/null 2>&1; then
    echo "first-run: removing bubblewrap, as on a fresh machine"
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq bubblewrap >/dev/null
fi
command -v bwrap >/dev/null && { echo "first-run: bwrap is still on PATH ($(command -v bwrap))" >&2; exit 1; }

tmp=$(mktemp -d /tmp/crewwork-first-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git clone -q . "$tmp/crewwork"
cd "$tmp/crewwork"
echo "first-run: make demo in a fresh clone at $tmp/crewwork"
start=$(date +%s)
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$HOME" LANG=C.UTF-8 \
    DOCKER_HOST="unix://$tmp/no-docker-engine.sock" make demo
echo "first-run: make demo succeeded in $(( $(date +%s) - start )) s"
command -v bwrap >/dev/null || { echo "first-run: make demo did not install bubblewrap" >&2; exit 1; }
