"""Relay schedulers: a pure core (``core``), stock-client support (``compat``)
and the zmq process around them (``node``)."""
