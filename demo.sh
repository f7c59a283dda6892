#!/usr/bin/env bash
# The main job: make an environment, start a local cluster (8 engines, the
# default tree), broadcast in both reply modes, print a comparison table, shut down.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c .ci/constraints.txt -e .
exec .venv/bin/python -m ipyparallel_broadcast.tools.demo "$@"
