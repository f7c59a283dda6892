"""The client process: ``Client``, ``BroadcastView`` and their results.

``client`` and ``view`` send one message per call; ``calls`` and ``results``
(sans I/O) file the replies; ``upstream`` is where ipyparallel's Client is
adapted; ``display/`` renders grouped outputs, reprs and timelines. Runs in
the user's process; imports ``wire`` (and the engine's ``compose`` for its
client-side calls).
"""
