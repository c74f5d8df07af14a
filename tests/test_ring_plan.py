"""Exhaustive tests of the ring's pure offset arithmetic (csrc/algorithms/ring_plan.h),
the tags its segments carry over Gloo's pairs (csrc/transport/gloo_link.h), and the
one-value encoding of every rank's Store value (csrc/transport/store_exchange.h).

Small sizes are enumerated completely (count 0..40, world size 1..8, every segment
cap): the chunks must tile the buffer, segments must tile each chunk, neighbours must
agree on every transfer, and a symbolic simulation of the schedule must leave every
rank with every other rank's contribution to every element, exactly once.
"""

from __future__ import annotations

import itertools

import pytest

_C = pytest.importorskip("ringpg._C")

pytestmark = pytest.mark.inprocess

COUNTS = range(0, 41)
SIZES = range(1, 9)


@pytest.mark.parametrize("size", SIZES)
def test_chunks_tile_the_buffer_and_are_balanced(size: int) -> None:
    for count in itertools.chain(COUNTS, [2**20 + 3, 2**31 + 5]):
        ranges = [_C.chunk_range(count, size, c) for c in range(size)]
        offset = 0
        for off, length in ranges:
            assert off == offset and length >= 0
            offset += length
        assert offset == count
        lengths = [length for _, length in ranges]
        assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("size", SIZES)
def test_segments_tile_every_chunk(size: int) -> None:
    for count, cap in itertools.product(COUNTS, range(1, 12)):
        segments, seg_elems = _C.segment_plan(count, size, cap)
        if count == 0:
            assert segments == 0
            continue
        assert 1 <= seg_elems <= cap
        max_chunk = -(-count // size)
        assert segments == -(-max_chunk // cap), "as few segments as the cap allows"
        assert segments * seg_elems >= max_chunk
        # Recover segment ranges from the schedule of rank 0 and check they tile chunks.
        if size == 1:
            continue
        sched = _C.ring_schedule(count, size, 0, cap)
        per_step: dict[int, list[tuple[int, int]]] = {}
        for step, _j, s_off, s_len, _r_off, _r_len in sched:
            per_step.setdefault(step, []).append((s_off, s_len))
        for step, segs in per_step.items():
            chunk = _C.chunk_range(count, size, (0 - step - 1) % size)
            covered = sorted((o, n) for o, n in segs if n > 0)
            pos = chunk[0]
            for o, n in covered:
                assert o == pos
                pos += n
            assert pos == chunk[0] + chunk[1]


@pytest.mark.parametrize("size", range(2, 9))
def test_neighbours_agree_and_simulation_reduces_everything(size: int) -> None:
    for count, cap in itertools.product([0, 1, size - 1, size, size + 1, 2 * size + 3, 40], [1, 2, 3, 7, 64]):
        scheds = [_C.ring_schedule(count, size, r, cap) for r in range(size)]
        # What rank r sends at (step, j) is what r + 1 receives at (step, j).
        for r in range(size):
            right = (r + 1) % size
            for a, b in zip(scheds[r], scheds[right]):
                assert a[:2] == b[:2]
                assert (a[2], a[3]) == (b[4], b[5])
        # Symbolic run: value[r][i] = set of ranks whose contribution element i holds.
        value = [[{r} for _ in range(count)] for r in range(size)]
        steps = 2 * size - 2
        segs = len(scheds[0]) // steps if steps and scheds[0] else 0
        for step in range(steps):
            reduce_step = step < size - 1
            sent = []
            for r in range(size):
                for j in range(segs):
                    _, _, s_off, s_len, _, _ = scheds[r][step * segs + j]
                    sent.append((r, s_off, [set(value[r][i]) for i in range(s_off, s_off + s_len)]))
            for r, s_off, payload in sent:
                dst = (r + 1) % size
                for k, contrib in enumerate(payload):
                    i = s_off + k
                    if reduce_step:
                        assert not (value[dst][i] & contrib), "a contribution would be added twice"
                        value[dst][i] = value[dst][i] | contrib
                    else:
                        value[dst][i] = contrib
        everyone = set(range(size))
        for r in range(size):
            assert all(v == everyone for v in value[r]), (count, size, cap, r)


def test_gloo_tags_are_int32_unique_in_flight_and_separate_signatures() -> None:
    """Gloo matches a receive to a send by (peer, tag) (csrc/transport/gloo_link.h): tags
    must be non-negative int32, distinct for the messages of one op and the next, and
    differ when two ranks run ops with different signatures."""
    allreduce, reduce_scatter = 1, 3  # c10d::OpType values, as the frame header carries them
    f32, f64 = 6, 7  # c10::ScalarType
    sum_, max_ = 0, 4  # c10d::ReduceOp
    tag = _C.gloo_tag
    seen: set[int] = set()
    for seq in (1, 2):  # an op and the next one, whose messages may overlap on a link
        for index in range(16384):
            t = tag(seq, allreduce, f32, sum_, 1 << 20, index)
            assert 0 <= t < 2**31, t
            seen.add(t)
    assert len(seen) == 2 * 16384
    base = tag(5, allreduce, f32, sum_, 1 << 20, 0)
    others = [
        tag(5, reduce_scatter, f32, sum_, 1 << 20, 0),
        tag(5, allreduce, f64, sum_, 1 << 20, 0),
        tag(5, allreduce, f32, max_, 1 << 20, 0),
        tag(5, allreduce, f32, sum_, 3 << 20, 0),
    ]
    assert all(o != base for o in others), (base, others)
    assert tag(5 + 256, allreduce, f32, sum_, 1 << 20, 0) == base  # seq is kept mod 256


HOST_LAYOUTS = [
    ["a"],
    ["a", "a"],
    ["a", "b"],
    ["a", "b", "a", "b"],
    ["b", "a", "a", "b", "c", "a"],
    ["a", "a", "b", "b"],
    ["x", "y", "z"],
    ["a", "b", "a"],
]


@pytest.mark.parametrize("hosts", HOST_LAYOUTS + [["a", "a", "a", "b", "b", "b", "c", "c", "c"]])
@pytest.mark.parametrize("algo", ["auto", "ring", "hier"])
def test_the_peers_a_group_connects_at_creation_are_its_rings_neighbours(hosts: list[str], algo: str) -> None:
    """What a group connects at creation (algorithms/hierarchical.h, ringPeers): each
    rank's neighbours on the ring and, where the hierarchical algorithms apply (hosts of
    equal numbers of ranks), on its host's ring and its local rank's ring across hosts;
    symmetric, so every rank waits only for peers that dial it too."""
    n = len(hosts)
    ring, host_of, per_host = _C.ring_order_by_host(hosts)
    peers = [_C.ring_peers(hosts, r, algo) for r in range(n)]
    for r in range(n):
        assert r not in peers[r] and peers[r] == sorted(set(peers[r]))
        for q in peers[r]:
            assert r in peers[q]
        at = ring.index(r)
        want = {ring[(at - 1) % n], ring[(at + 1) % n]} - {r}
        hier = algo != "ring" and per_host > 0 and (algo == "hier" or (len(set(hosts)) > 1 and per_host > 1))
        if hier:
            own = [q for q in ring if host_of[q] == host_of[r]]
            local = own.index(r)
            across = [[q for q in ring if host_of[q] == h][local] for h in range(len(set(hosts)))]
            for members in (own, across):
                i = members.index(r)
                want |= {members[(i - 1) % len(members)], members[(i + 1) % len(members)]} - {r}
        assert set(peers[r]) == want, (hosts, algo, r)


@pytest.mark.parametrize("hosts", HOST_LAYOUTS)
def test_ring_runs_host_by_host(hosts: list[str]) -> None:
    """The ring order (csrc/transport/topology.h): a permutation of the ranks in which
    each host's ranks are adjacent and ascending, hosts in order of first appearance, so
    the ring crosses each host boundary exactly once per direction."""
    ring, host_of, per_host = _C.ring_order_by_host(hosts)
    n = len(hosts)
    assert sorted(ring) == list(range(n))
    first_seen = list(dict.fromkeys(hosts))
    assert host_of == [first_seen.index(h) for h in hosts]
    assert ring == sorted(range(n), key=lambda r: (host_of[r], r))
    crossings = sum(host_of[ring[i]] != host_of[ring[(i + 1) % n]] for i in range(n))
    assert crossings == (len(first_seen) if len(first_seen) > 1 else 0)
    counts = {h: hosts.count(h) for h in first_seen}
    assert per_host == (counts[hosts[0]] if len(set(counts.values())) == 1 else 0)


@pytest.mark.parametrize(
    "hosts, form",
    [
        ([0], "blocks 1"),
        ([0] * 8, "blocks 8"),
        ([0, 0, 1, 1, 2, 2], "blocks 2"),
        ([0, 0, 0, 1, 1], "blocks 3"),  # the last host short
        ([0, 1, 0, 1], "cyclic 2"),
        ([0, 1, 2, 0, 1], "cyclic 3"),
        ([0, 1, 1, 0], "list 0 1 1 0"),
        ([0, 0, 1, 0], "list 0 0 1 0"),
    ],
)
@pytest.mark.parametrize("cpus_each", [True, False])
def test_hosts_travel_in_a_form_constant_in_size_for_launchers_layouts(hosts: list, form: str, cpus_each: bool) -> None:
    """The hosts rank 0 publishes (csrc/transport/topology.h): ranks host by host in
    blocks, or cyclically, travel in a few bytes whatever their number; other layouts
    as a list; either way every rank decodes exactly the hosts and CPUs rank 0 found."""
    count = max(hosts) + 1
    cpus = [4 + h for h in range(count)] if cpus_each else [16] * count
    text = _C.encode_hosts(hosts, cpus)
    assert text.split(";")[0] == form
    assert _C.decode_hosts(text, len(hosts)) == (hosts, cpus)
    if form.startswith(("blocks", "cyclic")) and not cpus_each:
        # Constant in size: the same layout of 1,000 times the ranks is as long.
        k = int(form.split()[1])
        step = (lambda r: r // k) if form.startswith("blocks") else (lambda r: r % k)
        wide = [step(r) for r in range(1000 * len(hosts))]
        assert _C.encode_hosts(wide, [16] * (max(wide) + 1)) == text


@pytest.mark.parametrize(
    "text", ["", "blocks 2", "blocks 0;every 4", "rows 2;every 4", "list 0 1;every 4", "cyclic 2;some 4"]
)
def test_malformed_hosts_are_refused(text: str) -> None:
    """A form cut short, of another kind or of fewer ranks than the group's is an error
    naming the Store, never a wrong topology."""
    with pytest.raises(RuntimeError, match="Store"):
        _C.decode_hosts(text, 4)


@pytest.mark.parametrize("size", range(1, 40))
def test_recursive_doubling_pairs_agree_and_sum_every_rank_once(size: int) -> None:
    """Recursive doubling (direct.h): the folds and every round's pairs are symmetric, and
    a symbolic run leaves every rank with every rank's contribution exactly once."""
    plans = [_C.recursive_doubling(size, r) for r in range(size)]
    held = {r: [r] for r in range(size)}  # the contributions each rank's buffer holds
    for r, (into, frm, _) in enumerate(plans):
        if into >= 0:
            assert plans[into][1] == r and plans[into][0] == -1, (size, r)
            held[into] = held[into] + held[r]
        if frm >= 0:
            assert plans[frm][0] == r, (size, r)
    active = [r for r in range(size) if plans[r][0] < 0]
    m = 1 << (size.bit_length() - 1)
    assert len(active) == m and all(len(plans[r][2]) == m.bit_length() - 1 for r in active)
    for rnd in range(m.bit_length() - 1):
        new = {}
        for r in active:
            q = plans[r][2][rnd]
            assert q in active and q != r and plans[q][2][rnd] == r, (size, r, rnd)
            new[r] = held[r] + held[q]
        held.update(new)
    for r in range(size):
        into = plans[r][0]
        final = held[into] if into >= 0 else held[r]
        assert sorted(final) == list(range(size)), (size, r, final)


@pytest.mark.parametrize("size", [*range(1, 34), 100, pytest.param(1024, marks=pytest.mark.slow)])  # 1024: 4-5 s
def test_bruck_rounds_pair_up_and_deliver_every_block_once(size: int) -> None:
    """Bruck's all-to-all (direct.h): in every round each rank's peers send to it what it
    expects, and a symbolic run leaves at rank r, under block i, exactly the block rank
    source[i] started with for r."""
    plans = [_C.bruck(size, r) for r in range(size)]
    rounds = max(size - 1, 0).bit_length()
    # held[r][i]: (sender, destination) of the block rank r holds under index i.
    held = [[(r, plans[r][0][i]) for i in range(size)] for r in range(size)]
    for rnd in range(rounds):
        bit = 1 << rnd
        moved = [i for i in range(size) if i & bit]
        new = [list(h) for h in held]
        for r in range(size):
            to, frm, idx = plans[r][1][rnd]
            assert idx == moved and to == (r + bit) % size, (size, r, rnd)
            assert plans[frm][1][rnd][0] == r, (size, r, rnd)  # the sender to r is r's source
            for i in idx:
                new[to][i] = held[r][i]
        held = new
    for r in range(size):
        assert len(plans[r][1]) == rounds
        for i in range(size):
            assert held[r][i] == (plans[r][2][i], r), (size, r, i, held[r][i])
    assert sorted(plans[0][2]) == list(range(size))
