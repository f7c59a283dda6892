"""``python -m ipyparallel_broadcast.tools.fuzz TARGET [libFuzzer options] [CORPUS ...]``:
one target (``targets.TARGETS``) under atheris, this package's code
instrumented for coverage. libFuzzer's options pass through (``-runs=N``,
``-artifact_prefix=DIR/``, ``-merge=1``); it prints its counts (``cov:``, ``ft:``,
``corp:``, ``exec/s``) and writes any crashing input as an artifact.
``benchmarks/scripts/fuzz.py`` runs every target and reports."""

import sys


def main():
    import atheris

    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    name = sys.argv.pop(1)
    with atheris.instrument_imports(include=["ipyparallel_broadcast"]):
        from ipyparallel_broadcast.tools.fuzz import targets
    if name not in targets.TARGETS:
        sys.exit(f"unknown target {name!r}: one of {sorted(targets.TARGETS)}")
    target = targets.TARGETS[name]
    # libFuzzer runs argv[0] through the shell for its inner processes (-merge=1): this very command
    argv = [f"{sys.executable} -m ipyparallel_broadcast.tools.fuzz {name}"] + sys.argv[1:]
    atheris.Setup(argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
