"""Emulated cluster on one machine: one network namespace per rank, shaped links, a bridge.

Layout (all names carry a unique prefix ``rpg<pid>-`` so concurrent runs never collide)::

    ns rpg<pid>-r0  [rpg0 192.168.77.1/24, tbf]──veth──[port0, tbf]┐
    ns rpg<pid>-r1  [rpg1 192.168.77.2/24, tbf]──veth──[port1, tbf]┼─ br0 (ns rpg<pid>-br)
    ...                                                            ┘

* Every address lives inside namespaces created here (192.168.77.0/24 by default); the
  root namespace gets no address, route or device (the veth pairs are created directly
  inside the new namespaces), so nothing outside them can be reached or disturbed.
* Each rank's link is full duplex at ``rate``: ``tc qdisc ... root tbf`` shapes the rank's
  egress (its upload) and the bridge port's egress (its download).  netem is not needed.
  Then the physical limit is exactly the link rate, and busbw / link rate is the figure
  that matters.
* Ranks run with ``ip netns exec <ns> python ...`` (:meth:`EmulatedCluster.exec_prefix`)
  and find their interface through GLOO_SOCKET_IFNAME / RINGPG_SOCKET_IFNAME
  (:meth:`EmulatedCluster.env`); rank 0's address is the rendezvous address.
* Teardown is guaranteed: context manager (try/finally), ``atexit`` and SIGTERM/SIGHUP
  handlers; processes still inside the namespaces are ended by pid first.  Namespaces
  left by a killed earlier run (``rpg<pid>-*`` whose pid is gone) are removed at setup.

Usable stand-alone for manual experiments::

    python -m benchmarks.netns --ranks 2 --rate 1gbit --selftest
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Dict, List, Optional, Sequence

NS_PREFIX = "rpg"
DEFAULT_SUBNET = "192.168.77"
_STALE = re.compile(rf"^{NS_PREFIX}(\d+)-(br|probe|r\d+)$")


class NetnsUnavailable(RuntimeError):
    """Emulation is impossible here (not root, iproute2 missing, netns not permitted)."""


def unavailable_reason() -> Optional[str]:
    """Why emulation cannot run on this machine, or None if it can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or without --emulate)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not found (install iproute2: apt-get install -y iproute2)"
    probe = f"{NS_PREFIX}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` is not permitted here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(cmd: Sequence[str]) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()}")


def _netns_list() -> List[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie -- dead, waiting for its parent to reap it -- does not)."""
    from devkit.launch import proc_stat  # here: `python benchmarks/netns.py` puts the package on the path late

    fields = proc_stat(pid)
    return bool(fields) and fields[0] != "Z"


def remove_stale() -> List[str]:
    """Delete namespaces of earlier runs of this tool whose process is gone."""
    removed = []
    for name in _netns_list():
        m = _STALE.match(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _kill_pids_in(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


def _pids_in(namespaces: Sequence[str]) -> List[int]:
    pids: List[int] = []
    for ns in namespaces:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
        pids += [int(p) for p in r.stdout.split() if p.isdigit() and int(p) != os.getpid()]
    return pids


def _kill_pids_in(*namespaces: str, grace_s: float = 2.0) -> None:
    """End, by pid, the processes still inside ``namespaces`` (only ours can be there):
    SIGTERM, then SIGKILL for those still running after ``grace_s``."""
    live = _pids_in(namespaces)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [p for p in live if _pid_alive(p)]
        if not live:
            return


@dataclass
class RankNet:
    """What a rank needs to know about its namespace."""

    rank: int
    netns: str
    ifname: str
    addr: str


_LIVE: Dict[int, "EmulatedCluster"] = {}
_HANDLERS_INSTALLED = False


def _cleanup_all() -> None:
    for cluster in list(_LIVE.values()):
        cluster.down()


def _on_signal(signum: int, frame: Optional[FrameType]) -> None:
    _cleanup_all()
    # Let try/finally blocks and atexit run, with the conventional exit status.
    raise SystemExit(128 + signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(_cleanup_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread
            pass
    _HANDLERS_INSTALLED = True


class EmulatedCluster:
    """``ranks`` namespaces on one bridge, every link shaped to ``rate_bps`` in both directions.

    With ``hosts=H`` there are H namespaces, one per emulated host, and rank r runs in
    host ``r % H``'s (a cyclic placement, as ``srun --distribution=cyclic`` gives):
    the ranks of one host share its link and, being in one network namespace, its
    memory as ringpg sees it (shared-memory links between them).
    """

    def __init__(
        self,
        ranks: int,
        rate_bps: int,
        *,
        subnet: str = DEFAULT_SUBNET,
        burst_bytes: Optional[int] = None,
        latency_ms: int = 50,
        shape_download: bool = True,
        mtu: int = 1500,
        hosts: Optional[int] = None,
    ) -> None:
        if not 1 <= ranks <= 250:
            raise ValueError("1..250 ranks")
        if hosts is not None and not 1 <= hosts <= ranks:
            raise ValueError("1..ranks hosts")
        self.hosts = hosts
        if not re.fullmatch(r"192\.168\.\d{1,3}", subnet):
            raise ValueError("subnet must be a 192.168.X prefix (private, inside our namespaces only)")
        self.ranks = ranks
        self.rate_bps = int(rate_bps)
        self.subnet = subnet
        # Bucket: 1 ms worth of tokens, at least 64 KiB (a GSO packet must fit).
        self.burst_bytes = burst_bytes or max(64 << 10, self.rate_bps // 8 // 1000)
        self.latency_ms = latency_ms
        self.shape_download = shape_download
        # 1500: Ethernet (TCP payload 1448 of 1514 bytes on the wire, a 95.6% ceiling);
        # 9000: jumbo frames, as many cluster networks run (8948 of 9014, 99.3%).
        if not 576 <= mtu <= 65000:
            raise ValueError("mtu must be in 576..65000")
        self.mtu = mtu
        self.prefix = f"{NS_PREFIX}{os.getpid()}-"
        self.bridge_ns = self.prefix + "br"
        self._created: List[str] = []
        self._up = False

    # -- addressing ------------------------------------------------------------------
    @property
    def namespaces(self) -> int:
        """Emulated hosts: one namespace (and one shaped link) each."""
        return self.hosts or self.ranks

    def host_of(self, r: int) -> int:
        """The namespace rank ``r`` runs in."""
        return r % self.namespaces

    def rank(self, r: int) -> RankNet:
        h = self.host_of(r)
        return RankNet(r, f"{self.prefix}r{h}", f"rpg{h}", f"{self.subnet}.{h + 1}")

    @property
    def master_addr(self) -> str:
        return self.rank(0).addr

    @property
    def link_GBps(self) -> float:
        """Link rate per direction in GB/s (10^9 bytes/s), the unit of busbw."""
        return self.rate_bps / 8 / 1e9

    def exec_prefix(self, r: int) -> List[str]:
        """Command prefix running a program inside rank ``r``'s namespace."""
        return ["ip", "netns", "exec", self.rank(r).netns]

    def env(self, r: int) -> Dict[str, str]:
        """Environment for rank ``r``: interface names for gloo and ringpg, rendezvous address."""
        net = self.rank(r)
        return {"GLOO_SOCKET_IFNAME": net.ifname, "RINGPG_SOCKET_IFNAME": net.ifname, "MASTER_ADDR": self.master_addr}

    def describe(self) -> str:
        from .units import format_rate  # local import keeps this module usable alone

        layout = f"{self.hosts} hosts (rank r on host r % {self.hosts}), " if self.hosts else ""
        return (
            f"{layout}{self.namespaces} namespaces {self.prefix}r*, veth links to bridge {self.bridge_ns}/br0, "
            f"{self.subnet}.0/24, tbf {format_rate(self.rate_bps)} burst {self.burst_bytes} B "
            f"latency {self.latency_ms} ms, mtu {self.mtu}, "
            f"{'both directions' if self.shape_download else 'egress only'}"
        )

    # -- lifecycle -------------------------------------------------------------------
    def up(self) -> "EmulatedCluster":
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        _install_handlers()
        _LIVE[id(self)] = self
        self._up = True
        stale = remove_stale()
        if stale:
            print(f"# netns: removed namespaces left by killed earlier runs: {', '.join(stale)}", file=sys.stderr)
        try:
            self._add_ns(self.bridge_ns)
            _run(
                [
                    "ip",
                    "-n",
                    self.bridge_ns,
                    "link",
                    "add",
                    "br0",
                    "type",
                    "bridge",
                    "forward_delay",
                    "0",
                    "stp_state",
                    "0",
                ]
            )
            _run(["ip", "-n", self.bridge_ns, "link", "set", "br0", "mtu", str(self.mtu), "up"])
            for h in range(self.namespaces):
                net = self.rank(h)  # rank h is the first on host h
                port = f"port{h}"
                self._add_ns(net.netns)
                _run(["ip", "-n", net.netns, "link", "set", "lo", "up"])
                _run(
                    [
                        "ip",
                        "-n",
                        net.netns,
                        "link",
                        "add",
                        net.ifname,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        port,
                        "netns",
                        self.bridge_ns,
                    ]
                )
                _run(["ip", "-n", net.netns, "addr", "add", f"{net.addr}/24", "dev", net.ifname])
                _run(["ip", "-n", net.netns, "link", "set", net.ifname, "mtu", str(self.mtu), "up"])
                _run(["ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", self.bridge_ns, "link", "set", port, "mtu", str(self.mtu), "up"])
                self._shape(net.netns, net.ifname)
                if self.shape_download:
                    self._shape(self.bridge_ns, port)
                self._keep_flow_order(net.netns, net.ifname)
                self._keep_flow_order(self.bridge_ns, port)
        except BaseException:
            self.down()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)

    def _shape(self, ns: str, dev: str) -> None:
        _run(
            [
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{self.rate_bps}bit",
                "burst",
                str(self.burst_bytes),
                "latency",
                f"{self.latency_ms}ms",
            ]
        )

    @staticmethod
    def _keep_flow_order(ns: str, dev: str) -> None:
        """Deliver each flow arriving on ``dev`` in order, as a wire does.

        A veth hands a packet to the receive backlog of the CPU that transmits it, and a
        tbf transmits from whichever CPU its timer or the sender runs on: consecutive
        packets of one flow land on different CPUs' backlogs and overtake each other.  TCP
        reads that as loss (SACK/DSACK reordering, spurious fast retransmits, cwnd cuts)
        although no queue dropped anything.  RPS over all CPUs steers by flow hash, so a
        flow always queues on one CPU, in order, and the work is still spread over CPUs.
        """
        cpus = os.cpu_count() or 1
        mask = f"{(1 << cpus) - 1:x}"
        # sysfs wants comma-separated 32-bit words, most significant first.
        words = [mask[max(0, i - 8) : i] for i in range(len(mask), 0, -8)][::-1]
        _run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "sh",
                "-c",
                f"for q in /sys/class/net/{dev}/queues/rx-*; do echo {','.join(words)} > $q/rps_cpus; done",
            ]
        )

    def down(self) -> None:
        """Remove everything this cluster created (idempotent, never raises)."""
        if not self._up:
            return
        self._up = False
        _LIVE.pop(id(self), None)
        try:
            _kill_pids_in(*self._created)
        except Exception as e:  # noqa: BLE001 - teardown must go on
            print(f"# netns: could not end processes in {self.prefix}*: {e}", file=sys.stderr)
        for ns in reversed(self._created):
            try:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            except Exception as e:  # noqa: BLE001 - teardown must go on
                print(f"# netns: could not delete {ns}: {e}", file=sys.stderr)
        self._created.clear()

    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def _selftest(cluster: EmulatedCluster, seconds: float) -> float:
    """Stream from rank 1 to rank 0 over the emulated link; return GB/s measured."""
    port = 29999
    recv = (
        "import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        f"s.bind(('{cluster.master_addr}',{port}));s.listen(1);c,_=s.accept();b=bytearray(1<<20);"
        "n=0;t=None\nwhile True:\n k=c.recv_into(b)\n if not k: break\n t=t or time.perf_counter();n+=k\n"
        "print(n/(time.perf_counter()-t)/1e9)"
    )
    send = (
        "import socket,time\nfor _ in range(100):\n try: s=socket.create_connection("
        f"('{cluster.master_addr}',{port}));break\n except OSError: time.sleep(0.05)\n"
        f"d=bytes(1<<20);e=time.perf_counter()+{seconds}\nwhile time.perf_counter()<e: s.sendall(d)\ns.close()"
    )
    rx = subprocess.Popen(cluster.exec_prefix(0) + [sys.executable, "-c", recv], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    tx = subprocess.Popen(cluster.exec_prefix(1) + [sys.executable, "-c", send])
    try:
        out, _ = rx.communicate(timeout=seconds + 30)
        tx.wait(timeout=30)
    finally:
        for p in (rx, tx):
            if p.poll() is None:
                p.kill()
    return float(out.strip() or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .units import format_rate, parse_rate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--selftest", action="store_true", help="measure rank 1 -> rank 0 throughput and exit")
    ap.add_argument("--hold", type=float, default=0.0, help="keep the cluster up this many seconds")
    ap.add_argument("--mtu", type=int, default=1500)
    args = ap.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"# netns emulation skipped: {reason}")
        return 0
    with EmulatedCluster(args.ranks, parse_rate(args.rate), mtu=args.mtu) as cl:
        print(f"# {cl.describe()}")
        if args.selftest and args.ranks >= 2:
            gbps = _selftest(cl, 2.0)
            print(f"# rank1 -> rank0: {gbps:.4f} GB/s = {gbps / cl.link_GBps:.1%} of {format_rate(cl.rate_bps)}")
        if args.hold > 0:
            time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from benchmarks.netns import main as _main  # noqa: E402

        sys.exit(_main())
    sys.exit(main())
