"""A TCP gate for tests: a forwarder held shut until opened, so that a
ZeroMQ peer connected through it has connected, and yet subscribed to nothing.

In a test: ``with TcpGate(host, port) as gate``. In a network namespace of the
bed: ``python tcpgate.py HOST PORT LISTEN`` prints its port, then reads
commands on stdin: ``waiting`` (prints the connections held) and ``open``.
"""

import socket
import sys
import threading


class TcpGate:
    """A TCP forwarder to ``(host, port)``, shut until ``open()``: a
    connection made meanwhile is accepted and held, its bytes unread, so a
    ZeroMQ peer behind it has connected and yet subscribed to nothing.
    ``with TcpGate(...) as gate:``; ``gate.port`` is where to connect."""

    def __init__(self, host: str, port: int, listen: str = "127.0.0.1"):
        self.target = (host, port)
        self.listener = socket.create_server((listen, 0))
        self.port = self.listener.getsockname()[1]
        self.held: list = []
        self.sockets: list = []
        self.opened = threading.Event()
        self.lock = threading.Lock()
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                self.sockets.append(conn)
                if self.opened.is_set():
                    self._forward(conn)
                else:
                    self.held.append(conn)

    def _forward(self, conn):
        upstream = socket.create_connection(self.target)
        self.sockets.append(upstream)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def open(self):
        with self.lock:
            self.opened.set()
            held, self.held = self.held, []
            for conn in held:
                self._forward(conn)

    def waiting(self) -> int:
        """Connections held at the gate."""
        with self.lock:
            return len(self.held)

    def close(self):
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RemoteGate:
    """A ``tcpgate.py`` run elsewhere (``popen``: its ``subprocess.Popen``, pipes to it)."""

    def __init__(self, popen):
        self.popen = popen
        self.port = int(popen.stdout.readline())

    def _ask(self, command: str) -> str:
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()
        return self.popen.stdout.readline().strip()

    def waiting(self) -> int:
        return int(self._ask("waiting"))

    def open(self):
        self._ask("open")

    def close(self):
        self.popen.kill()
        self.popen.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(host, port, listen):
    gate = TcpGate(host, int(port), listen)
    print(gate.port, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "open":
            gate.open()
            print("open", flush=True)
        elif command == "waiting":
            print(gate.waiting(), flush=True)
    gate.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
