"""A chaos soak: busy clients, a nemesis, and a checker that reads the history.

- ``engine_side``: what the workload runs on engines; each run appends its
  token to an engine-local log, so the checker can see what ran twice.
- ``workload``: one client process's loop over every operation and reply
  mode, recording each call's outcome per engine.
- ``nemesis``: the faults, injected at random on a live bed.
- ``checker``: pure; the history and the engine logs in, a verdict out.
- ``soak``: the bed (network namespaces of real engines, simulated hosts),
  the run, and the report (``python -m ipyparallel_broadcast.tools.chaos.soak``).
"""
