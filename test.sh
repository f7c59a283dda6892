#!/usr/bin/env bash
# Run the whole test suite in a fresh environment (real clusters, real sockets).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
exec .venv/bin/python -m pytest "$@"
