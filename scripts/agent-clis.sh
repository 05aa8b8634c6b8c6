#!/usr/bin/env bash
# Install the agent CLIs crewwork runs as its inner runner into a directory, at install time (never at run time):
# Codex CLI and Claude Code from npm (each its own prefix), mini-swe-agent from PyPI in a virtualenv of its own, made
# with PYTHON's base interpreter (the one the sandboxes have: bwrap shows it at its own path, the docker image holds it).
#   scripts/agent-clis.sh [DIR] [PYTHON]      DIR defaults to .cache/agents, PYTHON to .venv/bin/python
# Versions are pinned below; a directory already holding the pinned version is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-${CREWWORK_TEST_AGENT_CLIS:-.cache/agents}}"
PYTHON="${2:-.venv/bin/python}"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
CLAUDE_VERSION="${CLAUDE_VERSION:-2.1.197}"
MINI_VERSION="${MINI_VERSION:-2.4.6}"
mkdir -p "$DIR"

npm_cli() {  # npm_cli NAME PACKAGE VERSION
    local prefix="$DIR/$1"
    if [ -f "$prefix/node_modules/$2/package.json" ] \
        && grep -q "\"version\": \"$3\"" "$prefix/node_modules/$2/package.json"; then
        return
    fi
    command -v npm >/dev/null || { echo "agent-clis: npm is needed to install $2" >&2; exit 1; }
    echo "agent-clis: installing $2@$3 into $prefix"
    # The platform's native binary comes as an optional dependency of the package; its install script is not needed
    # (crewwork runs the platform package's binary directly).
    npm install --prefix "$prefix" --no-audit --no-fund --ignore-scripts --loglevel=error "$2@$3" >/dev/null
}
npm_cli codex @openai/codex "$CODEX_VERSION"
npm_cli claude-code @anthropic-ai/claude-code "$CLAUDE_VERSION"

VENV="$DIR/mini-swe-agent"
BASE="$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')"
if ! MSWEA_SILENT_STARTUP=1 MSWEA_GLOBAL_CONFIG_DIR="$(mktemp -d)" "$VENV/bin/python" -c "import minisweagent, sys; sys.exit(minisweagent.__version__ != '$MINI_VERSION')" 2>/dev/null \
    || [ "$(readlink -f "$VENV/bin/python")" != "$BASE" ]; then
    echo "agent-clis: installing mini-swe-agent==$MINI_VERSION into $VENV (interpreter $BASE)"
    rm -rf "$VENV"
    "$BASE" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "mini-swe-agent==$MINI_VERSION"
fi
# The sandbox user reads (never writes) the installations.
chmod -R a+rX "$DIR"
echo "agent-clis: ready in $DIR"
