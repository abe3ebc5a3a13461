"""Local ranks in their own network namespaces with a link ``tc`` can slow down (comm-slow on one box).

For reproducing S2 (a degraded link) on a single machine, as the fault tests do: every rank
gets a network namespace with one veth link to a bridge in a switch namespace, gloo is told
to use that link (``GLOO_SOCKET_IFNAME``), and ``throttle(rank)`` shapes both directions of one
rank's link with ``tc netem`` (delay and rate) or, where the kernel lacks netem, ``tc tbf``.
The broker stays on the host's loopback: a forwarder socket bound inside each namespace relays
127.0.0.1:PORT to it. Needs root and iproute2; ``netns_refusal()`` says why not otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import socket
import subprocess
import threading
import uuid


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path) as fh:
        if libc.setns(fh.fileno(), 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {path}")


class NetnsJob:
    """Ranks in their own network namespaces, joined by veth pairs to a bridge in a switch namespace.

    Each rank namespace also gets a loopback forwarder to the broker (a socket bound inside the
    namespace by a thread that entered it), so the attachment reaches 127.0.0.1:PORT as usual
    while gloo's traffic crosses the veth links, where ``tc`` shapes one rank's link.
    """

    def __init__(self, world: int, bootstrap: str) -> None:
        self.world = world
        self.tag = uuid.uuid4().hex[:4]
        self.net = f"10.{200 + int(self.tag[:2], 16) % 50}.{int(self.tag[2:], 16) % 250}"
        self.switch = f"cc{self.tag}sw"
        self.ns = [f"cc{self.tag}r{i}" for i in range(world)]
        host, _, port = bootstrap.rpartition(":")
        self.broker = (host, int(port))
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self.shaping = ""

    def addr(self, rank: int) -> str:
        return f"{self.net}.{rank + 1}"

    def host(self, rank: int) -> str:
        return f"cc{self.tag}-node{rank}"

    def prefixes(self, own_hosts: bool = False) -> list[list[str]]:
        """Each rank's command prefix: its namespace; with ``own_hosts`` also a UTS namespace of its own
        named ``host(rank)``, so each rank is a host of its own (its veth is that host's NIC), as the
        records' ``host`` field then says."""
        if not own_hosts:
            return [["ip", "netns", "exec", ns] for ns in self.ns]
        named = 'hostname {} && exec "$0" "$@"'
        return [["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", named.format(self.host(r))]
                for r, ns in enumerate(self.ns)]  # fmt: skip

    def rank_env(self) -> dict[int, dict[str, str]]:
        return {r: {"GLOO_SOCKET_IFNAME": "cv0"} for r in range(self.world)}

    def __enter__(self) -> NetnsJob:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for r, ns in enumerate(self.ns):
                a, b = f"c{self.tag}{r}a", f"c{self.tag}{r}b"
                _ip("netns", "add", ns)
                _ip("link", "add", a, "type", "veth", "peer", "name", b)
                _ip("link", "set", a, "netns", ns)
                _ip("-n", ns, "link", "set", a, "name", "cv0")
                _ip("link", "set", b, "netns", self.switch)
                _ip("-n", self.switch, "link", "set", b, "master", "br0")
                _ip("-n", self.switch, "link", "set", b, "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(r)}/24", "dev", "cv0")
                _ip("-n", ns, "link", "set", "cv0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self._forward(ns)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _forward(self, ns: str) -> None:
        made: list[socket.socket | BaseException] = []

        def bind_inside() -> None:  # a thread of its own: setns changes only the calling thread
            try:
                _setns(f"/var/run/netns/{ns}")
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", self.broker[1]))
                s.listen(16)
                made.append(s)
            except BaseException as exc:  # noqa: BLE001
                made.append(exc)

        t = threading.Thread(target=bind_inside)
        t.start()
        t.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        listener = made[0]
        self._socks.append(listener)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
                up = socket.create_connection(self.broker, timeout=5)
                up.settimeout(None)
            except OSError:
                return
            self._socks += [conn, up]
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def throttle(self, rank: int) -> str:
        """Shape both directions of one rank's link: netem delay+rate if present, else tbf."""
        b = f"c{self.tag}{rank}b"
        for ns, dev in ((self.ns[rank], "cv0"), (self.switch, b)):
            tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root"]
            q = subprocess.run([*tc, "netem", "delay", "5ms", "rate", "20mbit"], capture_output=True, text=True,
                               timeout=20)  # fmt: skip
            if q.returncode != 0:
                q = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                    "rate", "20mbit", "burst", "32kb", "latency", "400ms"],
                                   capture_output=True, text=True, timeout=20)  # fmt: skip
                self.shaping = "tbf rate 20mbit"
            else:
                self.shaping = "netem delay 5ms rate 20mbit"
            if q.returncode != 0:
                raise OSError(f"tc refused to shape {dev} in {ns}: {q.stderr.strip()}")
        return self.shaping

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
        for ns in [*self.ns, self.switch]:
            _ip("netns", "del", ns, check=False)


def netns_refusal() -> str | None:
    """Why this machine cannot run ranks in namespaces with a shaped link, or None when it can."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    name = f"cc{uuid.uuid4().hex[:6]}probe"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` was refused: {made.stderr.strip()}"
    try:
        veth = _ip("-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if veth.returncode != 0:
            return f"veth pairs are refused: {veth.stderr.strip()}"
        for qdisc in (["netem", "delay", "1ms"], ["tbf", "rate", "1mbit", "burst", "32kb", "latency", "400ms"]):
            q = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "p0", "root", *qdisc],
                               capture_output=True, text=True, timeout=20)  # fmt: skip
            if q.returncode == 0:
                return None
        return "neither tc netem nor tc tbf is available in this kernel"
    finally:
        _ip("netns", "del", name, check=False)
