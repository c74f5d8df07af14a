// Python bindings: the RingBackend class (a c10d Backend subclass, so torch can wrap it
// in a ProcessGroup), plus the pure pieces the tests check directly (the ring plan and
// the reduction kernels).
#include <ATen/ATen.h>
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <sys/socket.h>
#include <torch/csrc/utils/pybind.h>

#include <cerrno>
#include <cstring>

#include "algorithms/arena_collectives.h"
#include "algorithms/choice.h"
#include "algorithms/hierarchical.h"
#include "algorithms/ring_plan.h"
#include "backend/floor_backend.h"
#include "backend/ring_backend.h"
#include "bindings/seams.h"
#include "common/config.h"
#include "common/host.h"
#include "common/interpreter.h"
#include "common/torch_compat.h"
#include "cuda/host_register.h"
#include "reduce/reduce.h"
#include "transport/engine.h"
#include "transport/group_failure.h"
#include "transport/receiver.h"
#include "transport/request.h"
#include "transport/shm_segment.h"
#include "transport/shm_wait.h"
#include "transport/socket.h"
#include "transport/store_exchange.h"
#include "transport/wire.h"

namespace py = pybind11;

namespace {

// The whole plan of a ring over `count` elements for `rank`: for each step and
// segment, (step, segment, send_offset, send_length, recv_offset, recv_length).
std::vector<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t>> ringSchedule(int64_t count, int size,
                                                                                       int rank, int64_t maxSegElems) {
  using namespace ringpg;
  const SegmentPlan plan = segmentPlan(count, size, maxSegElems);
  std::vector<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t>> out;
  for (int step = 0; step < 2 * size - 2; ++step) {
    for (int64_t j = 0; j < plan.segments; ++j) {
      const Range s = segmentRange(chunkRange(count, size, ringSendChunk(rank, size, step)), plan, j);
      const Range r = segmentRange(chunkRange(count, size, ringRecvChunk(rank, size, step)), plan, j);
      out.emplace_back(step, j, s.offset, s.length, r.offset, r.length);
    }
  }
  return out;
}

ringpg::RedOp redOpFromName(const std::string& name) {
  using ringpg::RedOp;
  for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Band, RedOp::Bor, RedOp::Bxor}) {
    if (name == ringpg::redOpName(op)) {
      return op;
    }
  }
  TORCH_CHECK(false, "ringpg: unknown reduce op name ", name);
}

// A FrameReceiver (transport/receiver.h) driven as the engine drives it, over a
// scripted stream: each whole header routed by the next of `routes` ("deliver" into a
// receive of its length, "stash", "discard", "close"); what came out in `events`.  For
// the tests of the receive state machine alone.
struct ScriptedReceiver {
  ringpg::FrameReceiver rx;
  std::vector<char> buffer; // the delivered receive's
  py::list events;
  size_t consumed = 0;

  void event(const char* what, const ringpg::FrameHeader& h, py::bytes payload) {
    events.append(py::make_tuple(what, ringpg::frameKindName(h.kind), h.key, h.nbytes, std::move(payload)));
  }
  // A complete payload: ended as its state says.
  void finish() {
    using State = ringpg::FrameReceiver::State;
    const ringpg::FrameHeader h = rx.header();
    if (rx.state() == State::kPayload) {
      const ringpg::RequestPtr req = rx.endDelivery();
      event("deliver", h, py::bytes(req->buf, req->len));
    } else if (rx.state() == State::kStash) {
      const ringpg::Stashed st = rx.endStash();
      event("stash", h, py::bytes(st.data.data(), st.data.size()));
    } else {
      rx.endDiscard();
      event("discard", h, py::bytes());
    }
  }
  // Feeds `stream`, at most `chunk` bytes a read (and `budget` a payload read), until it
  // is used up, a goodbye closes it, or a header waits with no route left.
  void run(const std::string& stream, size_t chunk, const std::vector<std::string>& routes, size_t budget) {
    using State = ringpg::FrameReceiver::State;
    TORCH_CHECK(chunk > 0 && budget > 0, "chunk and budget must be positive");
    size_t route = 0;
    while (!rx.closed() && (consumed < stream.size() || rx.state() == State::kPaused)) {
      if (rx.state() == State::kPaused) {
        if (route == routes.size()) {
          break; // waits, unrouted, as a header of an op whose receive is not posted yet
        }
        const std::string& r = routes[route++];
        if (r == "deliver") {
          buffer.assign(rx.header().nbytes, 0);
          rx.deliverTo(ringpg::makeRequest(rx.header(), buffer.data(), buffer.size(), 0));
        } else if (r == "stash") {
          rx.stash();
        } else if (r == "discard") {
          rx.discard();
        } else {
          TORCH_CHECK(r == "close", "unknown route ", r);
          event("close", rx.header(), py::bytes());
          rx.close();
          continue;
        }
        if (rx.payloadComplete()) {
          finish();
        }
        continue;
      }
      auto [dst, n] = rx.nextRead(budget);
      n = std::min({n, chunk, stream.size() - consumed});
      std::memcpy(dst, stream.data() + consumed, n);
      consumed += n;
      if (rx.advance(n) == ringpg::FrameReceiver::Completed::kPayload) {
        finish();
      }
    }
  }
};

py::dict runFrameReceiver(const std::string& stream, size_t chunk, const std::vector<std::string>& routes,
                          size_t budget) {
  ScriptedReceiver s;
  s.run(stream, chunk, routes, budget);
  const ringpg::FrameReceiver::Position pos = s.rx.position();
  py::dict out;
  out["events"] = s.events;
  out["closed"] = s.rx.closed();
  out["paused"] = s.rx.state() == ringpg::FrameReceiver::State::kPaused;
  out["header_got"] = pos.headerGot;
  out["payload_left"] = pos.payloadLeft;
  out["abort_so_far"] = py::bytes(pos.abortSoFar);
  out["consumed"] = s.consumed;
  return out;
}

// The engine's search for why a connection was lost (Engine::causeOfLoss): `before`
// arrived while the connection was healthy (routed by `routes`, up to where it
// stops), `after` is what the peer still had in flight when it closed; `op`: the
// header of the op running here (32 bytes), or None.  (reason, network, remote).
py::tuple causeOfLoss(const std::string& before, const std::vector<std::string>& routes, const std::string& after,
                      const py::object& op) {
  ScriptedReceiver s;
  s.run(before, before.size() + 1, routes, size_t(1) << 20);
  TORCH_CHECK(s.consumed == before.size(), "`before` must be read whole (a header waits for a route)");
  int fds[2];
  TORCH_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0, "socketpair: ", std::strerror(errno));
  const ringpg::Fd mine(fds[0]);
  {
    const ringpg::Fd theirs(fds[1]);
    TORCH_CHECK(after.size() < 64 * 1024, "`after` must fit a socket's buffer");
    TORCH_CHECK(::send(theirs.get(), after.data(), after.size(), 0) == static_cast<ssize_t>(after.size()),
                "send: ", std::strerror(errno));
  } // closed: the peer is gone
  ringpg::FrameHeader running{};
  const bool haveOp = !op.is_none();
  if (haveOp) {
    const std::string raw = op.cast<std::string>();
    TORCH_CHECK(raw.size() == sizeof(running), "op must be one 32-byte frame header");
    std::memcpy(&running, raw.data(), sizeof(running));
  }
  bool network = true;
  bool remote = false;
  const std::string reason = ringpg::Engine::causeOfLoss(mine.get(), s.rx.position(), /*rank=*/0, /*peer=*/1,
                                                         haveOp ? &running : nullptr, &network, &remote);
  return py::make_tuple(reason, network, remote);
}

void installPythonHooks() {
  // What ringpg's C++ needs of Python, installed once (common/interpreter.h,
  // transport/gloo_link.h): blocking work with the interpreter's lock released, and
  // the gloo transport's ProcessGroupGloo, which only torch's Python binding can make
  // (it reads GLOO_SOCKET_IFNAME).
  ringpg::setBlockingRunner([](const std::function<void()>& fn) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release noGil;
      fn();
    } else {
      fn();
    }
  });
  ringpg::setGlooBackendFactory(
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
        py::gil_scoped_acquire gil;
        py::object gloo = py::module_::import("torch.distributed").attr("ProcessGroupGloo")(store, rank, size, timeout);
    // Its Python type derives from c10d's Backend binding.
        return gloo.cast<c10::intrusive_ptr<c10d::Backend>>();
      });
}

// The parts of RingBackend's binding that depend on the torch it is built against.
template <typename Class>
void bindBackendByTorchVersion(Class& backend) {
#if !RINGPG_HAS_BACKEND_ABORT_SHUTDOWN
  // torch's own Backend binding has these from 2.7 on (common/torch_compat.h).
  backend
      .def("abort", &ringpg::RingBackend::abort, py::call_guard<py::gil_scoped_release>(),
           "Fail every pending and later op of the group at once, telling the peers")
      .def("shutdown", &ringpg::RingBackend::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Finish the queued ops, then close the group; later ops are refused");
#endif
#if RINGPG_HAS_BACKEND_GET_ERROR
  // torch's C++ Backend has the virtual getError() from 2.7, but its Python binding gains
  // get_error() only in 2.14 (2.7 to 2.13 bind ErrorType and not the method): bound here,
  // so a ringpg group answers it on every torch that has the virtual.  From 2.14 this
  // shadows torch's binding, which calls the same virtual.
  backend.def("get_error", &ringpg::RingBackend::getError,
              "Whether the group has failed and why (ErrorType: SUCCESS, TIMEOUT, COMM_ERROR, REMOTE_ERROR)");
#endif
#if RINGPG_HAS_BACKEND_SPLIT
  // A backend that supports splitting gets this call from dist.new_group() on the ranks
  // outside the new group, when the default group has a bound device (NCCL must split
  // on every rank).  A ringpg group is made by its members alone: nothing to do.
  backend.def(
      "perform_nocolor_split", [](ringpg::RingBackend&, const py::object& /*device*/) {}, py::arg("device"),
      "No-op: ringpg's subgroups need nothing from non-members");
#endif
}

// RingBackend: the group as Python sees it (ringpg.backend(g)).
void bindBackend(py::module_& m) {
  auto backend =
      py::class_<ringpg::RingBackend, c10d::Backend, c10::intrusive_ptr<ringpg::RingBackend>>(m, "RingBackend");
  backend
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::string groupName, const std::string& transport,
                       const std::string& algo, const std::string& copy, const std::string& hostId) {
             // The GIL is released for the group's set-up (it waits on the Store and on
             // peers) inside the factory, not by a call_guard: with a call_guard pybind11
             // would register the new instance with the GIL still released, racing other
             // threads on its instance map ("Tried to deallocate unregistered instance!",
             // an abort; pybind11 issue 5473), which torchft's ranks-as-threads test hit
             // when two ranks created groups at once.
             py::gil_scoped_release noGil;
             return c10::make_intrusive<ringpg::RingBackend>(store, rank, size, timeout, std::move(groupName),
                                                             transport, algo, copy, hostId);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name") = "",
           py::arg("transport") = "", py::arg("algo") = "", py::arg("copy") = "", py::arg("host_id") = "",
           "`transport` (auto, shm, tcp, gloo; \"\": RINGPG_TRANSPORT's), `algo` (auto, ring, hier; \"\": "
           "RINGPG_ALGO's) and `copy` (auto, cma, slots; \"\": RINGPG_CMA_BYTES's) pick this group's links, "
           "algorithm and same-host copy; every rank must pass the same.  `host_id` (\"\": RINGPG_HOSTID's) is "
           "this rank's host identity: ranks with equal identities share a host (ranks as threads emulate hosts)")
      .def_property_readonly("local_address", &ringpg::RingBackend::localAddress)
      .def_property_readonly("_key_prefix", &ringpg::RingBackend::keyPrefix,
                             "this group's namespace in its Store (links made beside it key below it)")
      .def_property_readonly("transport", &ringpg::RingBackend::transport,
                             "the links collectives move over, the same on every rank: 'gloo' (Gloo's pairs, "
                             "RINGPG_TRANSPORT=gloo), 'shm' (shared memory, all ranks on one host), 'shm+tcp' "
                             "(shared memory within hosts, ringpg's engine between them), 'tcp' (the engine)")
      .def_property_readonly("same_host_copy", &ringpg::RingBackend::sameHostCopy,
                             "how same-host messages of at least RINGPG_CMA_BYTES move, the same on every rank: "
                             "'cma' (one copy, straight from the sender's buffer: cross-memory attach), 'slots' (two "
                             "copies through shared memory: the kernel refused the probe somewhere, "
                             "RINGPG_CMA_BYTES=0, or, with it unset, single copy measured slower: "
                             "same_host_copy_probe), or the two joined by '+' where they differ by the op's size "
                             "class: ops below streaming_op_bytes() first, from it second ('slots+cma'); '' (no "
                             "shared-memory link on this rank)")
      .def("_set_flight_recorder_ranks", &ringpg::RingBackend::setFlightRecorderRanks, py::arg("global_ranks"),
           py::arg("my_global_rank"),
           "The group's members' global ranks (by group rank) and this process's, for torch's flight "
           "recorder: the group's membership in its dumps and the dump file's rank (the creator sets them)")
      .def("_every_member_says", &ringpg::RingBackend::everyMemberSays, py::arg("mine"),
           py::call_guard<py::gil_scoped_release>(),
           "one host-arena round in which every rank says `mine`: True where all said True (the agreement "
           "the first device op runs on whether the arena reaches the device); collective, for the tests")
      .def_property_readonly("same_host_lent", &ringpg::RingBackend::sameHostLent,
                             "messages this rank has lent to its right same-host neighbour so far (single copy: "
                             "the neighbour read them straight from the caller's buffer)")
      .def_property_readonly(
          "same_host_copy_probe",
          [](const ringpg::RingBackend& b) -> py::object {
            const ringpg::ShmLink::CopyProbe p = b.sameHostCopyProbe();
            if (!p.measured) {
              return py::none();
            }
            py::dict d;
            d["bytes"] = p.bytes;
            d["cold_bytes"] = p.coldBytes;
            d["cma_us"] = p.lentMicros;
            d["slots_us"] = p.copiedMicros;
            d["cold_cma_us"] = p.coldLentMicros;
            d["cold_slots_us"] = p.coldCopiedMicros;
            return d;
          },
          "what the group measured at creation to choose same_host_copy, the same on every rank: "
          "{'bytes', 'cold_bytes', 'cma_us', 'slots_us', 'cold_cma_us', 'cold_slots_us'}, microseconds to "
          "move `bytes` each way around the host rings by single copy and through the slots (each rank's best "
          "of three, summed over the ranks), with the buffers in the caches, and (cold_) `cold_bytes` evicted "
          "from them; single "
          "copy for ops below streaming_op_bytes() where cma_us < 0.9 x slots_us, for ops from it where "
          "cold_cma_us < 0.9 x cold_slots_us; None where nothing was measured (RINGPG_CMA_BYTES set, single "
          "copy refused, no shared-memory link on this rank)")
      .def_property_readonly(
          "hosts", [](const ringpg::RingBackend& b) { return b.topology().hosts; },
          "how many hosts the group's ranks run on (RINGPG_HOSTID, else hostname, boot id, netns)")
      .def_property_readonly(
          "host_of", [](const ringpg::RingBackend& b) { return b.topology().hostOfEach(); },
          "each rank's host, numbered by first appearance")
      .def_property_readonly(
          "topology_holders", [](const ringpg::RingBackend& b) { return b.topology().holders(); },
          "how many topologies of this process share this group's per-rank arrays (groups of one process "
          "with the same hosts hold one copy); for the tests")
      .def_property_readonly(
          "ranks_per_host", [](const ringpg::RingBackend& b) { return b.topology().ranksPerHost(); },
          "K when every host holds K of the group's ranks, else 0")
      .def_property_readonly(
          "allreduce_algorithm", &ringpg::RingBackend::allreduceAlgorithm,
          "what a large allreduce on host memory runs: 'arena' (the host arena), 'hier' (host rings, then "
          "rings across hosts) or 'ring' (the group's algo, RINGPG_ALGO or ringpg.use_algorithm, and its "
          "shape decide)")
      .def("algorithm_for", &ringpg::RingBackend::algorithmFor, py::arg("op"), py::arg("nbytes"),
           py::arg("device") = "cpu",
           "the algorithm `op` (allreduce, reduce_scatter, all_gather, broadcast, reduce, barrier, gather, scatter, "
           "all_to_all) runs on `nbytes` of contiguous tensors on `device` ('cpu', 'cuda') in this group: local, "
           "oneshot, doubling, ring, chain, direct, pair, bruck, staged_ring, hier, arena_oneshot or arena (the "
           "op's plan, algorithms/choice.h); nbytes: reduce_scatter's input, all_gather's output")
      .def_property_readonly("arena_bytes", &ringpg::RingBackend::arenaBufferBytes,
                             "bytes of each of a rank's two buffers in the group's host arena (RINGPG_ARENA_BYTES, "
                             "in whole pages; in a group across hosts, its host's, which the hierarchical host "
                             "phases use); 0 where the group has none")
      .def_property_readonly("arena_why_not", &ringpg::RingBackend::arenaWhyNot,
                             "why a group whose algorithms would use a host arena has none, as this rank saw it "
                             "('' where it has one or would not use one)")
      .def_property_readonly(
          "arena_wait_counts",
          [](const ringpg::RingBackend& b) {
            const auto c = b.arenaWaitCounts();
            py::dict d;
            d["wakes"] = c.wakes;
            d["sleeps"] = c.sleeps;
            return d;
          },
          "how often this rank's waits in the host arena woke the others ('wakes': futex wake calls, made only "
          "by an arrival that completes a step others sleep on) and slept ('sleeps': futex waits), since the "
          "group was made; zeros where it has no arena (benchmarks/wakeups.py, the tests)")
      .def_property_readonly(
          "ring_order", [](const ringpg::RingBackend& b) { return b.topology().ringOrder(); },
          "the ranks in ring order: each host's ranks one after another")
      .def_property_readonly(
          "store_traffic",
          [](const ringpg::RingBackend& b) {
            const ringpg::StoreTraffic t = b.storeTraffic();
            return py::dict(py::arg("requests") = t.requests, py::arg("bytes_written") = t.bytesWritten,
                            py::arg("bytes_read") = t.bytesRead);
          },
          "what this group's Store calls cost this rank: 'requests', 'bytes_written' (keys and values) and "
          "'bytes_read' (values), from its creation on (addresses are read on a peer's first use); zeros "
          "without a Store (docs/scale.md)")
      .def_property_readonly("connected_peers", &ringpg::RingBackend::connectedPeers,
                             "the peers this rank has a TCP connection with: its rings' neighbours from "
                             "creation, others from their first use (RINGPG_TUNING connect=all: every peer)")
      .def_property_readonly(
          "tcp_congestion", &ringpg::RingBackend::tcpCongestion,
          "TCP congestion control of the data sockets (RINGPG_TUNING tcp_congestion, or the host's default)")
      .def_property("tracing", &ringpg::RingBackend::tracing, &ringpg::RingBackend::setTracing,
                    "whether this group's ops are traced (RINGPG_TRACE); switchable, from the next op")
      .def_property_readonly("wait_spin_us", &ringpg::RingBackend::waitSpinMicros,
                             "microseconds a wait polls before it sleeps (RINGPG_TUNING spin_us, or auto's choice)")
      .def_property_readonly("wait_spin_yields", &ringpg::RingBackend::waitSpinYields,
                             "whether those polls yield the CPU (this host's ranks outnumber the CPUs they may use "
                             "together), rather than pause")
      .def(
          "_debug_send_raw",
          [](ringpg::RingBackend& b, int peer, py::bytes data) { b.debugSendRaw(peer, std::string(data)); },
          "Test hook: put raw bytes on the connection to `peer` (plays a hostile peer).");
  bindBackendByTorchVersion(backend);
}

// The op's plan (algorithms/choice.h) for a group of any shape, for the tests: keyword
// arguments only, each with the default a one-host group of `size` ranks has.
void bindOpPlan(py::module_& m) {
  m.def(
      "plan_op",
      [](const std::string& op, int size, size_t nbytes, int hosts, int mostPerHost, bool hierarchical, bool ringFused,
         bool arena, const std::string& algo, int64_t oneShotBytes, int64_t streamBytes, bool device, bool contiguous,
         bool apart, bool readBack, bool arenaReachesDevice, bool copyCached, bool copyStreaming) {
        ringpg::Config cfg;
        cfg.algo = ringpg::Config::algoNamed(algo, "algo=");
        if (oneShotBytes >= 0) {
          cfg.oneShotBytes = static_cast<size_t>(oneShotBytes);
        }
        cfg.streamBytes = streamBytes;
        const ringpg::GroupShape g{size,
                                   hosts,
                                   mostPerHost < 0 ? size : mostPerHost,
                                   hierarchical,
                                   ringFused,
                                   arena,
                                   arenaReachesDevice,
                                   ringpg::SameHostCopy{copyCached, copyStreaming}};
        ringpg::OpQuery q;
        q.op = ringpg::collectiveNamed(op);
        q.bytes = nbytes;
        q.device = device;
        q.contiguous = contiguous;
        q.apart = apart;
        q.readBack = readBack;
        const ringpg::OpPlan plan = ringpg::planOp(q, g, cfg);
        py::dict d;
        d["algorithm"] = ringpg::algorithmName(plan.algorithm);
        d["staging"] = ringpg::stagingName(plan.staging);
        d["lends"] = plan.lends;
        d["streams"] = plan.streams;
        d["asks_device_reach"] = ringpg::planAsksDeviceReach(q, g);
        return d;
      },
      py::kw_only(), py::arg("op"), py::arg("size"), py::arg("nbytes"), py::arg("hosts") = 1,
      py::arg("most_per_host") = -1, py::arg("hierarchical") = false, py::arg("ring_fused") = true,
      py::arg("arena") = false, py::arg("algo") = "auto", py::arg("oneshot_bytes") = -1,
      py::arg("stream_bytes") = ringpg::Config::kStreamAuto, py::arg("device") = false, py::arg("contiguous") = true,
      py::arg("apart") = true, py::arg("read_back") = false, py::arg("arena_reaches_device") = false,
      py::arg("copy_cached") = false, py::arg("copy_streaming") = false,
      "algorithms/choice.h's plan (a dict: algorithm, staging, lends, streams, asks_device_reach) of `op` on "
      "`nbytes` in a group of this shape (default settings but `algo`, `oneshot_bytes` and `stream_bytes`, -1: "
      "the default; `device`, `contiguous`, `apart`, `read_back`: OpQuery's; `copy_cached`, `copy_streaming`: "
      "the group's single copy by size class, transport/link.h's SameHostCopy); for the tests");
  m.def(
      "same_host_links_serve",
      [](int size, int hosts, bool arena, const std::string& algo, const std::string& tuning) {
        ringpg::Config cfg = ringpg::Config::withTuning(tuning);
        cfg.algo = ringpg::Config::algoNamed(algo, "algo=");
        return ringpg::sameHostLinksServe(size, hosts, arena, cfg);
      },
      py::kw_only(), py::arg("size"), py::arg("hosts") = 1, py::arg("arena") = true, py::arg("algo") = "auto",
      py::arg("tuning") = "",
      "algorithms/choice.h's sameHostLinksServe: whether a group of this shape maps its same-host links (RINGPG_TUNING "
      "`tuning`); for the tests");
}

// What this build was compiled with, and the algorithm choice and arena arithmetic, for the tests.
void bindBuildAndChoice(py::module_& m) {
  // Which c10d APIs this build was compiled with (common/torch_compat.h; read by
  // ringpg.features()).
  m.def("torch_compat", [] {
    py::dict d;
    d["built_for"] = TORCH_VERSION;
    d["backend_abort_shutdown"] = static_cast<bool>(RINGPG_HAS_BACKEND_ABORT_SHUTDOWN);
    d["async_op_in_all_options"] = static_cast<bool>(RINGPG_HAS_ASYNC_OP_IN_ALL_OPTIONS);
    d["backend_set_timeout"] = static_cast<bool>(RINGPG_HAS_BACKEND_SET_TIMEOUT);
    d["backend_split"] = static_cast<bool>(RINGPG_HAS_BACKEND_SPLIT);
    d["backend_shrink"] = static_cast<bool>(RINGPG_HAS_BACKEND_SHRINK);
    d["premul_sum_supplement"] = static_cast<bool>(RINGPG_HAS_PREMUL_SUM_SUPPLEMENT);
    d["work_timeout"] = static_cast<bool>(RINGPG_HAS_WORK_TIMEOUT);
    d["backend_get_error"] = static_cast<bool>(RINGPG_HAS_BACKEND_GET_ERROR);
    d["backend_abort_hooks"] = static_cast<bool>(RINGPG_HAS_BACKEND_ABORT_HOOKS);
    d["backend_completion_hooks"] = static_cast<bool>(RINGPG_HAS_BACKEND_COMPLETION_HOOKS);
    d["native_flight_recorder"] = static_cast<bool>(RINGPG_HAS_NATIVE_FLIGHT_RECORDER);
    return d;
  });

  m.def("arena_oneshot_volume", [] { return ringpg::kArenaOneShotVolume; });
  m.def("arena_pair_all_gather_bytes", [] { return ringpg::kArenaPairAllGatherBytes; });
  m.def(
      "arena_pair_bytes", [] { return ringpg::kArenaPairBytes; },
      "up to this many bytes a two-rank reduce-scatter or all-gather runs on the arena (common/thresholds.h)");
  m.def(
      "pair_copied_most_bytes", [] { return ringpg::kPairCopiedMostBytes; },
      "up to this many bytes a pair's message is copied through the slots (common/thresholds.h)");
  m.def(
      "lent_reduce_from", [] { return ringpg::kLentReduceFrom; },
      "the op size (bytes) from which a ring of two lends its reduce steps, and below which two ranks' "
      "reduce-scatter runs as a pair (common/thresholds.h)");
  m.def(
      "staged_min_bytes", [] { return ringpg::kStagedMinBytes; },
      "the bytes from which a device tensor's op may be staged in pieces (common/thresholds.h)");
  m.def(
      "streaming_op_bytes", [] { return ringpg::kStreamingOpBytes; },
      "the op size (bytes, as plan_op counts them) from which same-host messages move as the group "
      "measured for buffers the caches do not hold (same_host_copy's second class)");
  m.def("auto_stream_from", &ringpg::Config::autoStreamFrom, py::arg("cache_bytes"),
        "the output size (bytes) from which all-gather streams under stream_bytes=auto, for a last-level "
        "cache of `cache_bytes` (0: never; common/thresholds.h)");
  m.def(
      "single_copy_for",
      [](bool cached, bool streaming, size_t nbytes) {
        return ringpg::singleCopyFor(ringpg::SameHostCopy{cached, streaming}, nbytes);
      },
      py::arg("cached"), py::arg("streaming"), py::arg("nbytes"),
      "algorithms/choice.h's singleCopyFor: whether an op on `nbytes` lends its same-host messages under "
      "a group whose size classes lend as given; for the tests");
  m.def("refuse_device_registration", &ringpg::refuseHostRegistration, py::arg("refuse"),
        "From now on this process's host arenas refuse to register with a device (cuda/host_register.h), "
        "so device tensors stage through pinned copies; for the tests");
  m.def("arena_piece_elems", &ringpg::arenaPieceElems, py::arg("buffer_bytes"), py::arg("elem_size"), py::arg("parts"),
        "elements of one host-arena piece (algorithms/arena_collectives.h); for the tests");
  m.def(
      "arena_segment_name", [](int pid, uint64_t nonce) { return ringpg::segmentName("arena", pid, nonce); },
      py::arg("pid"), py::arg("nonce"));
  m.def("segment_creator_pid", &ringpg::segmentCreatorPid, py::arg("name"),
        "the pid in a ringpg shared-memory segment's name (without '/'), 0 for any other name");
  m.def("reclaim_stale_segments", &ringpg::reclaimStaleSegments, py::arg("dir"), py::arg("min_age_seconds"),
        "unlinks ringpg segments in `dir` whose creator is gone; how many (transport/shm_segment.h)");
  m.def("flight_recorder_op_name", &ringpg::flightRecorderOpName, py::arg("profiling_title"),
        "The name torch's flight recorder analyzer knows a ringpg op by ('' where ringpg records none)");
  m.def("flight_recorder_p2p_name", &ringpg::flightRecorderP2PName, py::arg("is_send"), py::arg("me"), py::arg("peer"),
        "A send's or receive's name in the flight recorder ('send 0->1', 'recv 1<-0')");
  m.def("chunk_range", [](int64_t count, int parts, int c) {
    const auto r = ringpg::chunkRange(count, parts, c);
    return std::make_pair(r.offset, r.length);
  });
  m.def("segment_plan", [](int64_t count, int parts, int64_t maxSegElems) {
    const auto p = ringpg::segmentPlan(count, parts, maxSegElems);
    return std::make_pair(p.segments, p.segElems);
  });
}

// The ring's and the other algorithms' pure offset arithmetic, for the tests.
void bindPlans(py::module_& m) {
  m.def(
      "recursive_doubling",
      [](int size, int rank) {
        const ringpg::RecursiveDoubling rd(size);
        std::vector<int> partners;
        if (rd.foldedInto(rank) < 0) {
          for (int bit = 1; bit < rd.m; bit <<= 1) {
            partners.push_back(rd.partner(rank, bit));
          }
        }
        return py::make_tuple(rd.foldedInto(rank), rd.foldedFrom(rank), partners);
      },
      "(folded_into, folded_from, partners by round) of `rank` in recursive doubling at `size`");
  m.def(
      "bruck",
      [](int size, int rank) {
        const ringpg::Bruck bruck(size);
        std::vector<py::tuple> rounds;
        for (int bit = 1; bit < size; bit <<= 1) {
          rounds.push_back(py::make_tuple(bruck.sendsTo(rank, bit), bruck.takesFrom(rank, bit), bruck.movedIn(bit)));
        }
        std::vector<int> destination, source;
        for (int i = 0; i < size; ++i) {
          destination.push_back(bruck.destinationOf(rank, i));
          source.push_back(bruck.sourceOf(rank, i));
        }
        return py::make_tuple(destination, rounds, source);
      },
      "(destination of each block at the start, (to, from, moved block indices) by round, source of each "
      "block at the end) of `rank` in Bruck's all-to-all at `size`");
  m.def("ring_schedule", &ringSchedule, py::arg("count"), py::arg("size"), py::arg("rank"),
        py::arg("max_segment_elems"));
  m.def(
      "ring_order_by_host",
      [](const std::vector<std::string>& hostIds) {
        const auto t = ringpg::Topology::fromHosts(hostIds);
        return std::make_tuple(t.ringOrder(), t.hostOfEach(), t.ranksPerHost());
      },
      py::arg("host_ids"),
      "(ring order, host of each rank, ranks per host or 0) of ranks on these hosts "
      "(transport/topology.h); for the tests");
  m.def("run_frame_receiver", &runFrameReceiver, py::arg("stream"), py::arg("chunk"), py::arg("routes"),
        py::arg("budget") = size_t(1) << 20,
        "A FrameReceiver over `stream` (transport/receiver.h), `chunk` bytes a read, each header routed by the "
        "next of `routes`: deliver, stash, discard, close; its events and where it stopped; for the tests");
  m.def("cause_of_loss", &causeOfLoss, py::arg("before"), py::arg("routes"), py::arg("after"),
        py::arg("op") = py::none(),
        "Engine::causeOfLoss on a socket pair: what the frames a lost peer still had in flight say, after "
        "`before` was received; (reason, network, remote); for the tests");
  m.def(
      "ring_peers",
      [](const std::vector<std::string>& hostIds, int rank, const std::string& algo) {
        return ringpg::ringPeers(ringpg::Topology::fromHosts(hostIds), rank, ringpg::Config::algoNamed(algo, "algo="));
      },
      py::arg("host_ids"), py::arg("rank"), py::arg("algo") = "auto",
      "The peers rank's rings exchange with, which its group connects at creation "
      "(algorithms/hierarchical.h); for the tests");
}

// The reduction and scaling kernels, called on tensors directly (for tests).
void bindKernels(py::module_& m) {
  m.def(
      "reduce_kernel",
      [](const std::string& op, at::Tensor out, const at::Tensor& a, const at::Tensor& b, const std::string& isa) {
        TORCH_CHECK(out.is_contiguous() && a.is_contiguous() && b.is_contiguous() && out.is_cpu());
        TORCH_CHECK(a.numel() == b.numel() && out.numel() == a.numel());
        TORCH_CHECK(out.scalar_type() == a.scalar_type() && a.scalar_type() == b.scalar_type());
        const auto rop = redOpFromName(op);
        TORCH_CHECK(ringpg::reduceSupported(a.scalar_type(), rop), "unsupported");
        if (isa.empty()) {
          ringpg::reduce(a.scalar_type(), rop, out.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel());
        } else {
          ringpg::reduceWithIsa(isa, a.scalar_type(), rop, out.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel());
        }
      },
      py::arg("op"), py::arg("out"), py::arg("a"), py::arg("b"), py::arg("isa") = "",
      "out = a (op) b with ringpg's kernels (for tests); `isa` picks one of reduce_isas()");
  m.def(
      "scale_kernel",
      [](at::Tensor out, const at::Tensor& in, double by, bool divide, const std::string& isa) {
        TORCH_CHECK(out.is_contiguous() && in.is_contiguous() && out.is_cpu() && in.is_cpu());
        TORCH_CHECK(out.numel() == in.numel() && out.scalar_type() == in.scalar_type());
        const auto how = divide ? ringpg::Scale::Divide : ringpg::Scale::Multiply;
        if (isa.empty()) {
          ringpg::scaleFloats(in.scalar_type(), out.data_ptr(), in.data_ptr(), in.numel(), by, how);
        } else {
          ringpg::scaleFloatsWithIsa(isa, in.scalar_type(), out.data_ptr(), in.data_ptr(), in.numel(), by, how);
        }
      },
      py::arg("out"), py::arg("in"), py::arg("by"), py::arg("divide"), py::arg("isa") = "",
      "out = in / by (divide) or in * by with ringpg's AVG and PREMUL_SUM kernels (for tests); `isa` picks one "
      "of reduce_isas()");
}

// Settings as this process read them, the wire and Store formats, and host facts, for the tests.
void bindSettingsAndHost(py::module_& m) {
  m.def("reduce_isa", &ringpg::reduceIsa);
  m.def("reduce_isas", &ringpg::reduceIsas, "instruction sets whose kernels this CPU can run, best first");
  m.def("config_summary", [] { return ringpg::Config::get().summary(); });
  m.def(
      "tuning",
      [](const std::string& text) {
        std::map<std::string, std::string> values;
        for (auto& [key, value] : ringpg::Config::withTuning(text).tuningValues()) {
          values.emplace(std::move(key), std::move(value));
        }
        return values;
      },
      py::arg("text"),
      "Every RINGPG_TUNING key with the value a process whose RINGPG_TUNING is `text` runs with "
      "(the defaults where `text` leaves a key out); a malformed `text` raises as group creation would");
  m.def(
      "alltoall_algorithm", [](int size) { return ringpg::Config::get().bruckAllToAll(size) ? "bruck" : "direct"; },
      "The all-to-all algorithm a group of `size` ranks runs under this process's RINGPG_TUNING alltoall");
  m.def(
      "transport_setting", [] { return ringpg::Config::transportName(ringpg::Config::get().transport); },
      "RINGPG_TRANSPORT as this process read it: auto, tcp or gloo");
  m.def(
      "gloo_tag",
      [](uint64_t seq, int opcode, int dtype, int reduceOp, uint64_t numel, uint32_t index) {
        ringpg::FrameHeader h{};
        h.key = seq;
        h.opcode = static_cast<uint8_t>(opcode);
        h.dtype = static_cast<uint8_t>(dtype);
        h.reduceOp = static_cast<uint8_t>(reduceOp);
        h.opNumel = numel;
        return ringpg::GlooLink::tagOf(h, index);
      },
      "The Gloo tag of message `index` of an op (transport/gloo_link.h); for the tests");
  m.def("encode_hosts", &ringpg::encodeHosts, py::arg("host_of"), py::arg("host_cpus"),
        "The compact form of a group's hosts rank 0 publishes (transport/topology.h); for the tests");
  m.def(
      "decode_hosts",
      [](const std::string& text, int size) {
        std::vector<int> hostOf;
        std::vector<int> hostCpus;
        ringpg::decodeHosts(text, size, &hostOf, &hostCpus);
        return py::make_tuple(hostOf, hostCpus);
      },
      py::arg("text"), py::arg("size"), "The inverse of encode_hosts: (host_of, host_cpus); for the tests");
  m.def("cpus_from_cpu_max", &ringpg::cpusFromCpuMax,
        "CPUs a cgroup v2 cpu.max text allows (None: unlimited or unreadable); for tests");
  m.def("cache_bytes_from_text", &ringpg::cacheBytesFromText,
        "Bytes a sysfs cache size text reads ('32768K'; None: not a size); for tests");
  m.def("last_level_cache_bytes", &ringpg::lastLevelCacheBytes,
        "Bytes of this CPU's last-level cache (0: unknown), from which auto_stream_from() takes its threshold");
  m.def("cgroup_path", &ringpg::cgroupPath, py::arg("proc_self_cgroup"), py::arg("controller"),
        "This process's cgroup path from /proc/self/cgroup text (controller '' = the v2 hierarchy)");
  m.def("quota_cpus_along", &ringpg::quotaCpusAlong, py::arg("mount"), py::arg("path"), py::arg("v2"),
        "Tightest CFS quota, in CPUs, on a cgroup and its ancestors (None: no limit)");
  m.def("usable_cpus", &ringpg::usableCpus, "CPUs this process may use (affinity, lowered by a CFS quota)");
  m.def(
      "cpu_hint_confirms",
      [](int tid, int cpu) {
        ringpg::CpuHint hint{};
        hint.cpu.store(cpu);
        hint.tid.store(tid);
        return hint.confirmedOn(cpu);
      },
      py::arg("tid"), py::arg("cpu"),
      "transport/shm_wait.h's CpuHint::confirmedOn: whether the kernel last ran thread `tid` on `cpu` (true where "
      "it cannot say)");
  m.def(
      "cpu_hint_published_tid",
      [] {
        ringpg::CpuHint hint{};
        hint.publish(0);
        return hint.tid.load();
      },
      "the thread id a CpuHint published by the calling thread carries (its kernel id, asked again after a fork)");
  m.def("cpu_share_text", &ringpg::cpuShareText,
        "This process's affinity mask as a CPU list and its quota ('0-3;-'), as a group exchanges it");
  m.def("cpus_together", &ringpg::cpusTogether, py::arg("shares"),
        "CPUs processes with these cpu_share_text values may run on together (union of masks, quota-capped)");
}

// The test seams (bindings/seams.h): collectives over in-process loopback links, and
// an Engine whose peers a test plays over raw sockets.  For the tests only.
void bindTestSeams(py::module_& m) {
  m.def(
      "run_in_process",
      [](const std::string& op, const std::vector<at::Tensor>& inputs, const std::string& reduceOp, int root,
         const std::string& algo, int64_t oneShotBytes, int64_t segmentBytes, int repeat, int absentRank,
         int64_t timeoutMs) {
        ringpg::seams::InProcessOptions o;
        o.reduceOp = reduceOp;
        o.root = root;
        o.algo = algo;
        o.oneShotBytes = oneShotBytes;
        o.segmentBytes = segmentBytes;
        o.repeat = repeat;
        o.absentRank = absentRank;
        o.timeout = std::chrono::milliseconds(timeoutMs);
        ringpg::seams::InProcessResult r;
        {
          py::gil_scoped_release noGil; // the ranks' threads and workers never take it
          r = ringpg::seams::runInProcess(op, inputs, o);
        }
        py::dict d;
        d["outputs"] = r.outputs;
        d["errors"] = r.errors;
        d["algorithm"] = r.algorithm;
        d["seconds"] = r.seconds;
        return d;
      },
      py::arg("op"), py::arg("inputs"), py::arg("reduce_op") = "sum", py::arg("root") = 0, py::arg("algo") = "auto",
      py::arg("oneshot_bytes") = -1, py::arg("segment_bytes") = -1, py::arg("repeat") = 1, py::arg("absent_rank") = -1,
      py::arg("timeout_ms") = 10000,
      "Runs `op` (allreduce, reduce_scatter, all_gather, broadcast, reduce) on len(inputs) ranks in this "
      "process, a thread each, rank r on inputs[r]: each rank a RingBackend over in-process loopback links "
      "(transport/loopback_link.h), `repeat` times; `absent_rank` calls nothing.  {'outputs': by rank (None where it "
      "failed), 'errors': by "
      "rank ('' where it succeeded), 'algorithm': rank 0's choice for the op, 'seconds': the runs' wall time}; "
      "for the tests");

  using Probe = ringpg::seams::EngineProbe;
  py::class_<Probe>(m, "EngineProbe",
                    "A real Engine (transport/engine.h) listening on 127.0.0.1, whose peers a test plays over raw "
                    "sockets: the hello, dialling and the engine's matching; for the tests")
      .def(py::init<int, int, const std::vector<std::string>&, const std::vector<uint64_t>&, uint64_t>(),
           py::arg("rank"), py::arg("size"), py::arg("addrs"), py::arg("nonces"), py::arg("nonce"),
           "rank `rank` of `size`; peer q listens at addrs[q] and its hellos quote nonces[q] (this rank's "
           "entries are ignored: it listens on an ephemeral port of its own, quoting `nonce`)")
      .def_property_readonly("address", &Probe::address, "where this engine listens ('127.0.0.1:PORT')")
      .def("post_send", &Probe::postSend, py::arg("peer"), py::arg("header"), py::arg("payload"),
           "posts a send of `payload` with the 32-byte `header` (its nbytes set to the payload's length); its id")
      .def("post_recv", &Probe::postRecv, py::arg("peer"), py::arg("header"), py::arg("nbytes"),
           "posts a receive of `nbytes` from `peer` (-1: any source, p2p only) expecting `header`; its id")
      .def(
          "wait",
          [](Probe& p, int64_t id, int64_t timeoutMs) {
            std::tuple<std::string, std::string, std::string, int> r;
            {
              py::gil_scoped_release noGil;
              r = p.wait(id, std::chrono::milliseconds(timeoutMs));
            }
            return py::make_tuple(std::get<0>(r), std::get<1>(r), py::bytes(std::get<2>(r)), std::get<3>(r));
          },
          py::arg("id"), py::arg("timeout_ms"),
          "waits up to `timeout_ms` for request `id`: (state 'pending'/'done'/'failed', error, payload, source rank)")
      .def("set_current_collective", &Probe::setCurrentCollective, py::arg("header"),
           "Engine::setCurrentCollective: the op running here (a 32-byte header)")
      .def(
          "connect_peers",
          [](Probe& p, const std::vector<int>& peers, int64_t timeoutMs) {
            p.connectPeers(peers, std::chrono::milliseconds(timeoutMs));
          },
          py::arg("peers"), py::arg("timeout_ms"), py::call_guard<py::gil_scoped_release>(),
          "Engine::connectPeers: dials each and waits for each to dial back, within `timeout_ms`")
      .def(
          "broken_reason", [](Probe& p) { return p.engine().failure().reason(); }, "'' while the engine is healthy")
      .def(
          "fail_group", [](Probe& p, const std::string& reason) { p.engine().failure().fail(reason); },
          py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
          "records a failure on the engine's group, as another link or the op context would (GroupFailure::fail)")
      .def(
          "connected_peers", [](Probe& p) { return p.engine().connectedPeers(); }, "the peers with a socket either way")
      .def(
          "gone_from", [](Probe& p, int peer) { return p.engine().goneFrom(peer); }, py::arg("peer"),
          "why nothing more comes from `peer` if it left: it said goodbye (or answered a hello as leaving), or "
          "its connection closed between frames with nothing of it expected; else ''")
      .def(
          "shutdown",
          [](Probe& p, int64_t timeoutMs) {
            p.engine().shutdown(ringpg::Clock::now() + std::chrono::milliseconds(timeoutMs));
          },
          py::arg("timeout_ms"), py::call_guard<py::gil_scoped_release>(),
          "Engine::shutdown: a goodbye to each connected peer, then stop");
}

// A group's failure state on its own (transport/group_failure.h), for its unit tests.
void bindGroupFailure(py::module_& m) {
  using ringpg::BreakCause;
  using ringpg::GroupFailure;
  py::enum_<BreakCause>(m, "BreakCause")
      .value("LOCAL", BreakCause::Local)
      .value("TIMEOUT", BreakCause::Timeout)
      .value("REMOTE", BreakCause::Remote)
      .value("ABORTED", BreakCause::Aborted);
  py::class_<GroupFailure, std::shared_ptr<GroupFailure>>(m, "GroupFailure", "a group's failure state")
      .def(py::init<>())
      .def("fail", &GroupFailure::fail, py::arg("reason"), py::arg("network") = false,
           py::arg("cause") = BreakCause::Local, py::call_guard<py::gil_scoped_release>(),
           "records the failure (the first reason wins) and, if first, runs every listener")
      .def("failed", &GroupFailure::failed)
      .def(
          "reason",
          [](const GroupFailure& f) {
            bool network = true;
            BreakCause cause = BreakCause::Local;
            std::string why = f.reason(&network, &cause);
            return py::make_tuple(why, network, cause);
          },
          "(reason, network, cause); reason '' while healthy")
      .def("listen", &GroupFailure::listen, py::arg("listener"), "adds a listener; returns its token")
      .def("unlisten", &GroupFailure::unlisten, py::arg("token"));
}

} // namespace

// FloorBackend: torch's own cost of an op, for the benchmarks (backend/floor_backend.h).
void bindFloor(py::module_& m) {
  py::class_<ringpg::FloorBackend, c10d::Backend, c10::intrusive_ptr<ringpg::FloorBackend>>(m, "FloorBackend")
      .def(py::init<int, int>(), py::arg("rank"), py::arg("size"),
           "A backend whose every op completes at once and touches no tensor");
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringpg's compiled core";
  py::module_::import("torch.distributed");
  installPythonHooks();
  bindBackend(m);
  bindFloor(m);
  bindBuildAndChoice(m);
  bindOpPlan(m);
  bindPlans(m);
  bindKernels(m);
  bindSettingsAndHost(m);
  bindTestSeams(m);
  bindGroupFailure(m);
}
