#!/usr/bin/env bash
# What `make demo` and `make dev` need besides Python packages: an isolating sandbox. Where none works yet and this
# machine can install one (root, apt-get), install bubblewrap: one Debian package, daemonless. Otherwise change
# nothing: `crewwork demo` then says in one line what to install and how (or runs without isolation if asked with
# --unsafe). Idempotent.
#   scripts/sandbox-env.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-.venv/bin/python}"

# gVisor, Docker or bubblewrap already works: nothing to do (exit 1 means only the unsafe `local` is left).
if "$PYTHON" -m crewwork sandbox check >/dev/null 2>&1; then
    exit 0
fi
if command -v bwrap >/dev/null; then
    exit 0  # installed but unusable here (user namespaces off): `crewwork demo` says why, nothing to install
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    exit 0  # cannot install here: `crewwork demo` says what to install
fi
echo "sandbox-env: no isolating sandbox yet; installing bubblewrap (apt-get install -y bubblewrap)"
export DEBIAN_FRONTEND=noninteractive
# Fresh machines often have no package lists yet: update only when the install needs it.
if ! apt-get install -y -qq bubblewrap >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null ||
        echo "sandbox-env: could not install bubblewrap (see above)" >&2
fi
