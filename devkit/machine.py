"""Facts about this machine: what every run prints first, and what sizes its ranks.

The facts (:func:`machine_facts`) are the context a figure needs to be read: cores this
process may use, CPU, memory, kernel, torch, the backends and their state, the host's
TCP congestion control, the load (a warning when other processes compete for the
cores) and every ``RINGPG_*`` setting.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
from typing import Dict, Mapping, Optional

import torch


def open_sockets() -> int:
    """How many sockets this process has open (Linux: its /proc/self/fd links)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def threads() -> int:
    """How many threads this process runs (Linux: /proc/self/task)."""
    return len(os.listdir("/proc/self/task"))


def rss_mb() -> float:
    """This process's resident memory (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def default_threads(world_size: int) -> int:
    """Intra-op threads per rank so that ranks do not oversubscribe the cores."""
    return max(1, usable_cores() // max(1, world_size))


def default_tcp_congestion() -> str:
    """The TCP congestion control this process's network namespace gives a new socket
    (gloo's always, ringpg's unless RINGPG_TUNING sets tcp_congestion)."""
    try:
        with socket.socket() as s:
            return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
    except (OSError, AttributeError):  # not Linux
        return "unknown"


def machine_facts(
    backends: Mapping[str, str], device: str, extra: Optional[Mapping[str, str]] = None
) -> Dict[str, str]:
    """Facts printed first by every run: nproc, CPU, memory, torch, backends."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or "unknown"
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                    break
    except OSError:
        pass
    usable = usable_cores()
    facts = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "nproc": f"{usable} (os.cpu_count {os.cpu_count()})",
        "cpu": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device if device == "cpu" else f"{device} ({torch.cuda.get_device_name()})",
    }
    try:
        load1 = os.getloadavg()[0]
        facts["load"] = f"{load1:.2f} (1-min average)"
        if load1 > 0.5 * max(1, usable):
            facts["load"] += " -- WARNING: other processes compete for the cores; timings are unreliable"
    except OSError:
        pass
    facts["backends"] = "; ".join(f"{k}: {v}" for k, v in backends.items())
    facts["tcp cc"] = f"{default_tcp_congestion()} (what a socket gets unless it chooses)"
    knobs = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("RINGPG_"))
    facts["settings"] = " ".join(knobs) if knobs else "(no RINGPG_* variable set: defaults)"
    if extra:
        facts.update(extra)
    return facts


def format_facts(facts: Mapping[str, str]) -> str:
    """The facts as aligned ``# key : value`` comment lines."""
    width = max(len(k) for k in facts)
    return "\n".join(f"# {k:<{width}} : {v}" for k, v in facts.items())
