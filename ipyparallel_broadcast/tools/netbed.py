"""A multi-host test bed on one machine: each host a Linux network namespace.

Hosts hang off one bridge, each by a veth pair, with an address on a private
/24 that the bed picks among subnets no interface of this machine uses. The
controller gets a host of its own (``bed.controller``); the test process
stays in the root namespace, where the bridge has the subnet's ``.1``.

    with NetBed(hosts=3) as bed:
        bed.limit(bed.hosts[0], "1gbit")        # tbf, both directions
        p = bed.popen(bed.hosts[0], [sys.executable, "-c", "..."])
        rx, tx = bed.link_bytes(bed.hosts[0])   # bytes into / out of the host

Everything the bed makes is named ``ib<pid>x<n>...``: on the way out it kills
every process inside its namespaces and deletes them and its links, and on
the way in it removes what a bed of a dead process left behind. It needs
root (``NetBed.available()`` says why not). Hosts on the bed share the
hostname, the filesystem and ``/dev/shm``; only the network namespace tells
them apart (see ``hostid``).
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

_beds = itertools.count()
SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # the bed takes one free /24 of these


class NetBedError(RuntimeError):
    pass


def _ip(*args, ns: str | None = None, check=True) -> str:
    argv = ["ip"] + (["-n", ns] if ns else []) + list(args)
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise NetBedError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _tc(*args, ns: str | None = None):
    argv = (["ip", "netns", "exec", ns] if ns else []) + ["tc"] + list(args)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise NetBedError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str  # "ctl", "h1", ...
    netns: str  # the namespace's name
    addr: str  # its address on the bed's subnet
    veth: str  # the root-side end of its link (a bridge port)

    def __str__(self):
        return f"{self.name} ({self.addr})"


class Managed:
    """``with`` it: ``start()`` (``close()`` if that fails), then ``close()``."""

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()


class NetBed(Managed):
    """``hosts`` engine hosts and a controller host on one bridge."""

    def __init__(self, hosts: int = 3, controller: bool = True):
        self.tag = f"ib{os.getpid():x}x{next(_beds)}"
        self.n_hosts, self.with_controller = hosts, controller
        self.hosts: list[Host] = []
        self.controller: Host | None = None
        self.bridge = f"{self.tag}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), in order made

    # ----------------------------------------------------------- lifecycle
    @staticmethod
    def available() -> str | None:
        """None if a bed can be made here, else why not."""
        if os.geteuid() != 0:
            return "the multi-host test bed needs root (network namespaces)"
        try:
            _ip("netns", "list")
            subprocess.run(["tc", "-V"], capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError, NetBedError) as e:
            return f"iproute2 (ip, tc) is not usable: {e}"
        return None

    def start(self):
        sweep_stale()
        self.subnet = _free_subnet()
        addrs = self.subnet.hosts()
        gateway = next(addrs)
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        names = (["ctl"] if self.with_controller else []) + [f"h{i + 1}" for i in range(self.n_hosts)]
        for i, name in enumerate(names):
            host = Host(name, f"{self.tag}-{name}", str(next(addrs)), f"{self.tag}v{i}")
            _ip("netns", "add", host.netns)
            self._made.append(("netns", host.netns))
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            self._made.append(("link", host.veth))
            _ip("link", "set", host.veth, "master", self.bridge, "up")
            _ip("addr", "add", f"{host.addr}/{self.subnet.prefixlen}", "dev", "eth0", ns=host.netns)
            _ip("link", "set", "eth0", "up", ns=host.netns)
            _ip("link", "set", "lo", "up", ns=host.netns)
            _ip("route", "add", "default", "via", str(gateway), ns=host.netns)
            if name == "ctl":
                self.controller = host
            else:
                self.hosts.append(host)

    def close(self):
        """Kill every process in the bed's namespaces; delete them and its links,
        and the shared-memory segments its killed relays left (the hosts share
        ``/dev/shm``, and no relay or controller lived on to sweep them)."""
        from ..host import shm

        killed = False
        for kind, name in reversed(self._made):
            if kind == "netns":
                kill_namespace(name)
                _ip("netns", "del", name, check=False)
                killed = True
            else:
                _ip("link", "del", name, check=False)
        self._made.clear()
        if killed:
            shm.sweep()

    # ------------------------------------------------------------ per host
    def popen(self, host: Host, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s namespace (its own process group)."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(["ip", "netns", "exec", host.netns] + list(argv), **kwargs)

    def pids(self, host: Host) -> list[int]:
        """The processes running in ``host``'s namespace."""
        return [int(p) for p in _ip("netns", "pids", host.netns, check=False).split()]

    def link_bytes(self, host: Host) -> tuple[int, int]:
        """Bytes (into, out of) ``host`` over its link so far."""
        stats = f"/sys/class/net/{host.veth}/statistics"
        with open(f"{stats}/tx_bytes") as into, open(f"{stats}/rx_bytes") as out:
            return int(into.read()), int(out.read())

    def set_link(self, host: Host, up: bool):
        """Take ``host``'s link down (its cable pulled) or bring it back."""
        _ip("link", "set", host.veth, "up" if up else "down")

    def limit(self, host: Host, rate: str):
        """A token-bucket rate limit (e.g. ``"1gbit"``) on ``host``'s link, each way."""
        bits = _rate_bits(rate)
        burst = max(bits // 8 // 100, 32 * 1024)  # 10 ms at full rate
        spec = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]
        _tc("qdisc", "replace", "dev", host.veth, *spec)
        _tc("qdisc", "replace", "dev", "eth0", *spec, ns=host.netns)


def _rate_bits(rate: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. '100mbit' or '1gbit'")
    return int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)])


def _free_subnet() -> ipaddress.IPv4Network:
    used = [ipaddress.ip_interface(a).network for a in re.findall(r"inet (\S+)", _ip("-o", "-4", "addr"))]
    for net in SUBNETS.subnets(new_prefix=24):
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetBedError(f"no free /24 left in {SUBNETS}")


def kill_namespace(netns: str, timeout: float = 10):
    """SIGKILL every process in ``netns`` and wait until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise NetBedError(f"processes {pids} in {netns} outlived SIGKILL")
        time.sleep(0.05)


def sweep_stale():
    """Remove namespaces and links of beds whose process is gone."""

    def dead(name):
        m = re.match(r"ib([0-9a-f]+)x\d+", name)
        if not m:
            return False
        try:
            os.kill(int(m.group(1), 16), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if dead(name):
            kill_namespace(name)
            _ip("netns", "del", name, check=False)
    for name in re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", check=False), re.M):
        if dead(name):
            _ip("link", "del", name, check=False)
