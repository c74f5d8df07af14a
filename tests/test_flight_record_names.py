"""The names ringpg writes into torch's flight recorder (backend/flight_record.h) are the
ones torch's analyzer knows (``torch.distributed.flight_recorder``'s COLLECTIVES and P2P
sets), for every profiling title the C++ backend uses: the titles are read from its
source, not listed here, so a new op cannot slip past.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.inprocess

OPS_SOURCE = Path(__file__).resolve().parents[1] / "csrc" / "backend" / "ring_backend_ops.cpp"


def _c():
    from ringpg._loader import load_extension

    c = load_extension()
    if not hasattr(c, "flight_recorder_op_name"):
        pytest.skip("this build has no flight recorder names")
    return c


def _analyzer_names() -> tuple[set, set]:
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    return set(types.COLLECTIVES), set(types.P2P)


def test_every_collective_title_maps_to_a_name_the_analyzer_knows() -> None:
    c = _c()
    collectives, _ = _analyzer_names()
    titles = set(re.findall(r'"(ringpg:[a-z_]+)"', OPS_SOURCE.read_text()))
    titles -= {"ringpg:send", "ringpg:recv", "ringpg:recvAnySource"}  # point-to-point: below
    assert len(titles) >= 15, titles
    unrecorded = {t for t in titles if c.flight_recorder_op_name(t) == ""}
    assert unrecorded == {"ringpg:every_member_says"}, unrecorded  # ringpg's own round, never the caller's
    for t in titles - unrecorded:
        assert c.flight_recorder_op_name(t) in collectives, (t, c.flight_recorder_op_name(t))
    # The tensor forms keep the c10d method names torch's hook used for them.
    assert c.flight_recorder_op_name("ringpg:all_gather_into_tensor") == "_all_gather_base"
    assert c.flight_recorder_op_name("ringpg:reduce_scatter_tensor") == "_reduce_scatter_base"
    assert c.flight_recorder_op_name("gloo:all_reduce") == ""  # not ringpg's


def test_point_to_point_names_parse_as_the_analyzer_parses_them() -> None:
    c = _c()
    _, p2p = _analyzer_names()
    send, recv, anysource = (
        c.flight_recorder_p2p_name(True, 0, 3),
        c.flight_recorder_p2p_name(False, 3, 0),
        c.flight_recorder_p2p_name(False, 2, -1),
    )
    for name in (send, recv, anysource):
        assert name.split(" ")[0] in p2p, name
    # The analyzer splits "send a->b" and "recv b<-a" on the arrow; "?" is any source.
    assert send.split(" ")[1].split("->") == ["0", "3"]
    assert recv.split(" ")[1].split("<-") == ["3", "0"]
    assert anysource.split(" ")[1].split("<-") == ["2", "?"]
