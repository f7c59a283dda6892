"""Fuzzing every boundary where a process reads another's bytes: the targets
(``targets``) and their coverage-guided runner (``python -m
ipyparallel_broadcast.tools.fuzz TARGET [libFuzzer options]``, atheris)."""
