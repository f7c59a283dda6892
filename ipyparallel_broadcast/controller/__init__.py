"""The controller process: ipyparallel's controller, with the relay tree in
place of its broadcast scheduler (``app``), every hook into the hub in one
place (``hubhooks``), the hub's broadcast records (``records``), and its
IOPub, mux and control relays (``iopubrelay``, ``queues``).
``python -m ipyparallel_broadcast.controller`` runs it. Imports ``wire``,
``host`` and ``relay`` (it starts the relay nodes).
"""
