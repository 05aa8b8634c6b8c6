#!/usr/bin/env bash
# Install and start what the test suite needs besides Python packages. Idempotent; needs root.
#   scripts/test-env.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-.venv/bin/python}"
export DEBIAN_FRONTEND=noninteractive

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v git >/dev/null || need+=(git)
command -v psql >/dev/null || need+=(postgresql-client)
command -v chromium >/dev/null || need+=(chromium)
# Repository tests: sshd serves ssh:// remotes on loopback; the system python's venv module builds environments.
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v jq >/dev/null || need+=(jq)  # tests/integration/test_cli_scripting.py drives the CLI with `--json | jq`
# Workspace disk caps (loopback ext4 images) and running bwrap as the unprivileged sandbox user.
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v setpriv >/dev/null || need+=(util-linux)
# bench/mcp.py compares search_code with ripgrep run bare; tests/codeintel indexes in an empty network namespace
# (`unshare`, util-linux).
command -v rg >/dev/null || need+=(ripgrep)
command -v findmnt >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
    echo "test-env: installing ${need[*]}"
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# PostgreSQL runs on these machines before every session and CI run; start it if it was stopped.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "test-env: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 || { echo "test-env: PostgreSQL is not reachable at 127.0.0.1:5432" >&2; exit 1; }

# Packages the repository tests serve from a loopback package index (tests/repos/test-packages.txt): downloaded now,
# at install time, never while the tests run.
PACKAGES="${CREWWORK_TEST_PACKAGES:-.cache/test-packages}"
if [ ! -f "$PACKAGES/.complete" ] || [ tests/repos/test-packages.txt -nt "$PACKAGES/.complete" ]; then
    echo "test-env: downloading test packages into $PACKAGES"
    mkdir -p "$PACKAGES/wheels" "$PACKAGES/sdists"
    wheels=$(awk '$1 == "wheel" {print $2}' tests/repos/test-packages.txt)
    sdists=$(awk '$1 == "sdist" {print $2}' tests/repos/test-packages.txt)
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download --quiet --no-deps --only-binary :all: -d "$PACKAGES/wheels" $wheels
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: -d "$PACKAGES/sdists" $sdists
    touch "$PACKAGES/.complete"
fi
# axe-core, the accessibility checker the browser tests load into the console's pages from disk (tests/browser/axe.py):
# installed now from npm, never fetched while the tests run.
AXE_VERSION=4.14.1
AXE_DIR="${CREWWORK_TEST_NODE:-.cache/node}"
if [ ! -f "$AXE_DIR/node_modules/axe-core/axe.min.js" ] || ! grep -q "\"version\": \"$AXE_VERSION\"" "$AXE_DIR/node_modules/axe-core/package.json"; then
    command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
    echo "test-env: installing axe-core $AXE_VERSION into $AXE_DIR"
    npm install --silent --no-audit --no-fund --prefix "$AXE_DIR" "axe-core@$AXE_VERSION"
fi
# GitHub's official OpenAPI description and example webhook payloads, which the forge tests check the local GitHub
# against and send (tests/fakes/github_openapi.py): installed now from npm, never fetched while the tests run.
OCTOKIT_OPENAPI_VERSION=23.0.2
OCTOKIT_WEBHOOKS_EXAMPLES_VERSION=7.6.1
if ! grep -qs "\"version\": \"$OCTOKIT_OPENAPI_VERSION\"" "$AXE_DIR/node_modules/@octokit/openapi/package.json" \
    || ! grep -qs "\"version\": \"$OCTOKIT_WEBHOOKS_EXAMPLES_VERSION\"" "$AXE_DIR/node_modules/@octokit/webhooks-examples/package.json"; then
    command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
    echo "test-env: installing @octokit/openapi $OCTOKIT_OPENAPI_VERSION and @octokit/webhooks-examples into $AXE_DIR"
    npm install --silent --no-audit --no-fund --prefix "$AXE_DIR" "axe-core@$AXE_VERSION" \
        "@octokit/openapi@$OCTOKIT_OPENAPI_VERSION" "@octokit/webhooks-examples@$OCTOKIT_WEBHOOKS_EXAMPLES_VERSION"
fi
# The example agent plugin, installed like any plugin (tests/integration/test_agent_plugins.py runs it for real).
"$PYTHON" -m pip install --quiet --no-deps ./examples/crewwork-example-agent

# The agent CLIs the tests run unmodified in the sandbox (tests/agents/test_agent_clis.py, tests/integration/
# test_agent_clis_e2e.py): Codex CLI and Claude Code from npm, mini-swe-agent from PyPI, installed now, never at run time.
command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
bash scripts/agent-clis.sh "${CREWWORK_TEST_AGENT_CLIS:-.cache/agents}" "$PYTHON"

# A Docker engine with gVisor and the locally built sandbox image (no registry is reachable).
bash .ci/docker-up.sh "$PYTHON"
# The compose stack's images (tests/deploy/test_compose_stack.py), built from Debian's and PyPI's packages: about
# 6 minutes the first time on a 2-core machine, seconds after (docs/deployment.md, "Without a registry").
bash deploy/local/build-images.sh
echo "test-env: ready"
