"""The engine process: ipyparallel's engine with a lean broadcast path.

``app`` (the engine application), ``kernel`` (replies with outputs, lean
streams), ``applycall`` (unpickled functions kept), ``forked`` (engines
forked from one warm process) and ``compose/`` (threads shared by the engines
of a host). ``python -m ipyparallel_broadcast.engine`` runs it. Imports
``wire`` and ``host``; never client code. Nothing is imported here, so that
an engine sets its thread limits before anything imports NumPy.
"""
