#!/usr/bin/env bash
# Run the test suite in a fresh environment (real clusters, real sockets).
# `./test.sh -m pure` (the sans-I/O tests, in minutes) installs only the
# `test` extra; anything else installs all the suite uses (the `suite` extra).
# Versions: those the suite last passed on (.ci/constraints.txt, by .ci/freeze).
set -euo pipefail
cd "$(dirname "$0")"
extras=suite
case " $* " in *" -m pure "*) extras=test ;; esac
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c .ci/constraints.txt -e ".[$extras]"
# MPI engines need mpi4py built against the system's MPICH (tests/test_mpi.py skips without it)
if [[ $extras == suite ]] && command -v mpicc >/dev/null && ! .venv/bin/python -c "import mpi4py" 2>/dev/null; then
    .venv/bin/python -m pip install -q -c .ci/constraints.txt --no-binary mpi4py mpi4py
fi
exec .venv/bin/python -m pytest "$@"
