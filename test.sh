#!/usr/bin/env bash
# Run the whole test suite in a fresh environment (real clusters, real sockets).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
# MPI engines need mpi4py built against the system's MPICH (tests/test_mpi.py skips without it)
if command -v mpicc >/dev/null && ! .venv/bin/python -c "import mpi4py" 2>/dev/null; then
    .venv/bin/python -m pip install -q --no-binary mpi4py mpi4py
fi
exec .venv/bin/python -m pytest "$@"
