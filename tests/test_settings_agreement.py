"""Settings the ranks of a group must share are agreed on when the group is created.

The algorithm (``RINGPG_ALGO`` / ``ringpg.use_algorithm``), the segment, one-shot and
hierarchical piece sizes and the all-to-all algorithm (``RINGPG_ALLTOALL``) decide which frames each rank sends and expects, and tracing
runs a clock sync at creation: ranks that differ in any of them get one ``ValueError``
on every rank, within seconds, naming each setting and every rank's value (before,
they failed their first op with a "collective mismatch ... nbytes=" that named none,
issue 31 item 3).  The transport was agreed on already (tests/test_faults.py).

Settings that stay local are shown to be local: ranks whose receive windows differ
run the ring on shared memory, ringpg's TCP and Gloo's pairs with exact results.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import transport_of

pytestmark = pytest.mark.skipif(harness.backend_under_test() != "ringpg", reason="ringpg's group settings")

# Rank 1's values of every shared setting, where ranks 0 and 2 keep the defaults.
RANK1_ENV = {
    "RINGPG_SEGMENT_BYTES": "65536",
    "RINGPG_ONESHOT_BYTES": "0",
    "RINGPG_HIER_PIECE_BYTES": "65536",
    "RINGPG_ALGO": "ring",
    "RINGPG_ALLTOALL": "bruck",
}
DEFAULTS = {
    "RINGPG_SEGMENT_BYTES": "524288",
    "RINGPG_ONESHOT_BYTES": "262144",
    "RINGPG_HIER_PIECE_BYTES": "2097152",
    "RINGPG_ALGO": "auto",
    "RINGPG_ALLTOALL": "auto",
}


def _rank1_differs(rank: int, ws: int, port: int, args: Any) -> dict:
    (trace_dir,) = args
    if rank == 1:
        os.environ.update(RANK1_ENV)
        os.environ["RINGPG_TRACE"] = trace_dir
    kind, msg, took = harness.expect_error(lambda: harness.init_ringpg(rank, ws, port, timeout_s=30.0))
    return {"type": kind, "msg": msg, "took": took}


def test_a_rank_that_differs_fails_every_rank_naming_each_setting(tmp_path: Any) -> None:
    res = harness.run_scenario(_rank1_differs, 3, (str(tmp_path),))
    for r, v in res.items():
        assert v["type"] == "ValueError", (r, v)
        assert v["msg"].count("ringpg: the ranks of a group disagree on") == 1, v["msg"]
        for name, value in RANK1_ENV.items():
            dflt = DEFAULTS[name]
            shown = "RINGPG_ALGO / ringpg.use_algorithm" if name == "RINGPG_ALGO" else name
            assert f"{shown} (rank 0: {dflt}, rank 1: {value}, rank 2: {dflt})" in v["msg"], (name, v["msg"])
        assert "RINGPG_TRACE (rank 0: off, rank 1: on, rank 2: off)" in v["msg"], v["msg"]
        assert "RINGPG_TRANSPORT" not in v["msg"], v["msg"]  # equal: not named
        assert v["took"] < harness.KILL_DETECT_S, v


def _local_settings_differ_then_algorithms(rank: int, ws: int, port: int, args: Any) -> dict:
    """Equal non-default shared settings and receive windows that differ (local): the ring
    runs on each transport; then one rank picks another algorithm with use_algorithm."""
    import ringpg

    os.environ["RINGPG_SEGMENT_BYTES"] = "65536"  # equal on every rank, not the default
    os.environ["RINGPG_RECV_WINDOW"] = {0: "16", 1: "1"}.get(rank, "")  # rank 2: the default
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws, timeout=timedelta(seconds=30)
    )
    out: dict[str, Any] = {}
    n = 1 << 18  # 1 MiB of float32: past the one-shot limit, several segments per chunk
    x = torch.arange(n, dtype=torch.float32) % 1000 + rank
    want_sum = (torch.arange(n, dtype=torch.float32) % 1000) * ws + sum(range(ws))
    for transport in ("auto", "tcp", "gloo"):
        with ringpg.use_transport(transport):
            g = dist.new_group(backend="ringpg")
        y = x.clone()
        dist.all_reduce(y, group=g)
        rs = torch.empty(n // ws)
        dist.reduce_scatter_tensor(rs, x[: n // ws * ws].clone(), group=g)
        ag = torch.empty(n * ws)
        dist.all_gather_into_tensor(ag, x, group=g)
        want_ag = torch.cat([torch.arange(n, dtype=torch.float32) % 1000 + q for q in range(ws)])
        out[transport] = {
            "transport": transport_of(g),
            "all_reduce": bool(torch.equal(y, want_sum)),
            "reduce_scatter": bool(torch.equal(rs, want_sum[rank * (n // ws) : (rank + 1) * (n // ws)])),
            "all_gather": bool(torch.equal(ag, want_ag)),
        }
    with ringpg.use_algorithm("ring" if rank == 1 else "auto"):
        out["algo_type"], out["algo_msg"], out["algo_took"] = harness.expect_error(
            lambda: dist.new_group(backend="ringpg")
        )
    return out


def test_local_settings_may_differ_and_use_algorithm_is_agreed() -> None:
    res = harness.run_scenario(_local_settings_differ_then_algorithms, 3)
    for r, v in res.items():
        assert "crash" not in v, v
        for transport, want in (("auto", "shm"), ("tcp", "tcp"), ("gloo", "gloo")):
            assert v[transport] == {
                "transport": want,
                "all_reduce": True,
                "reduce_scatter": True,
                "all_gather": True,
            }, (r, transport, v[transport])
        assert v["algo_type"] == "ValueError", v
        assert (
            "disagree on RINGPG_ALGO / ringpg.use_algorithm (rank 0: auto, rank 1: ring, rank 2: auto); "
            "it must be the same on every rank"
        ) in v["algo_msg"], v["algo_msg"]
        assert v["algo_took"] < harness.KILL_DETECT_S, v
