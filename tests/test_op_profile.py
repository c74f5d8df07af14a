"""benchmarks.op_profile: perf's report is read line by line and each function charged to its item."""

from __future__ import annotations

import pytest

from benchmarks import op_profile

REPORT = """\
# Samples: 3K of event 'cpu-clock'
#
  Samples  Shared Object                          Symbol
  .......  .....................................  ......
     2431  [vdso]                                 [.] __vdso_clock_gettime
     1507  _C.cpython-311-x86_64-linux-gnu.so     [.] ringpg::ShmLink::waitUntil(std::shared_ptr<ringpg::Request> const&, std::chrono::time_point<std::chrono::_V2::steady_clock, std::chrono::duration<long, std::ratio<1l, 1000000000l> > >)
      360  libpython3.11.so.1.0                   [.] _PyEval_EvalFrameDefault
      104  libc.so.6                              [.] __memmove_avx_unaligned_erms
       77  [kernel.kallsyms]                      [k] futex_wait
       12  libtorch_cpu.so                        [.] c10d::FlightRecorder<c10d::Event>::record(...)
        9  libtorch_cpu.so                        [.] c10d::ProcessGroup::allreduce(...)
"""


@pytest.mark.inprocess
def test_report_lines_are_read_and_charged_to_their_items() -> None:
    rows = op_profile.parse_report(REPORT)
    assert [n for n, _, _ in rows] == [2431, 1507, 360, 104, 77, 12, 9]
    items = [op_profile.item_of(dso, sym) for _, dso, sym in rows]
    assert items == [
        "clock reads (vdso: mostly the waits' deadline checks)",
        "ringpg: waits (flags, spins)",
        "Python interpreter",
        "data: memcpy/memset (libc)",
        "kernel: futex, scheduler",
        "flight recorder",
        "torch: c10d (ProcessGroup, Work)",
    ]
    lines = op_profile.table(rows, ops=100, wall=0.1, freq=20000, top=2)
    # 4500 samples at 50 us each over 100 ops: 2250 us of CPU an op; the wall 1000 us.
    assert any(line.split()[-1] == "2250.00" and "on the CPU" in line for line in lines), lines
    assert any(line.split()[-1] == "1000.00" and "wall" in line for line in lines), lines
