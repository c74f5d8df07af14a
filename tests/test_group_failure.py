"""A group's failure state (csrc/transport/group_failure.h), on its own and as the engine
acts on it.

Every link's waits ask one GroupFailure and every link reports to it; the engine is one
of its listeners.  Here: the first reason and cause win, listeners run once, on the
first failure only, on the thread that recorded it and with no lock of the class held
(a listener may ask for the reason).  How the engine acts on a failure recorded
elsewhere: test_engine_seams.
"""

from __future__ import annotations

import threading

import pytest
from ringpg import _C

pytestmark = pytest.mark.inprocess


def test_the_first_reason_and_cause_win() -> None:
    f = _C.GroupFailure()
    assert not f.failed() and f.reason()[0] == ""
    f.fail("rank 3 timed out", network=False, cause=_C.BreakCause.TIMEOUT)
    f.fail("rank 1 lost its connection", network=True, cause=_C.BreakCause.LOCAL)
    assert f.failed()
    assert f.reason() == ("rank 3 timed out", False, _C.BreakCause.TIMEOUT)


def test_listeners_run_once_on_the_first_failure_and_may_ask_for_the_reason() -> None:
    f = _C.GroupFailure()
    heard: list[tuple[str, str]] = []
    f.listen(lambda: heard.append(("a", f.reason()[0])))
    token = f.listen(lambda: heard.append(("b", f.reason()[0])))
    f.listen(lambda: heard.append(("c", f.reason()[0])))
    f.unlisten(token)
    f.fail("first")
    f.fail("second")
    assert heard == [("a", "first"), ("c", "first")]
    late: list[int] = []
    f.listen(lambda: late.append(1))  # after the failure: the caller asks failed() instead
    f.fail("third")
    assert late == [] and f.reason()[0] == "first"


def test_of_many_threads_failing_at_once_one_reason_wins_and_listeners_run_once() -> None:
    for _ in range(20):
        f = _C.GroupFailure()
        runs: list[str] = []
        f.listen(lambda: runs.append(threading.current_thread().name))
        start = threading.Barrier(8)

        def fail(i: int) -> None:
            start.wait()
            f.fail(f"thread {i}", network=bool(i % 2))

        threads = [threading.Thread(target=fail, args=(i,), name=f"t{i}") for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        why, network, _ = f.reason()
        i = int(why.split()[1])
        assert network == bool(i % 2)
        assert runs == [f"t{i}"]  # once, on the thread whose reason won
