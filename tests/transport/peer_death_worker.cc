// peer_death_worker: one rank of a peer-death run (tests/transport/peer_death_test.cc,
// bench/peer_death_bench.cc). Every rank runs one kind of collective in a loop; the victim
// dies at its point and the survivors must raise gloo::IoException.
//
//   peer_death_worker --rank=R --size=N --store=DIR --info=DIR --victim=V
//                     --device=udp|tcp|dpdk
//                     --op=allreduce|optireduce|broadcast|barrier|sendrecv|recv_any|buffer_recv|idle
//                     --at=before|during|between --how=exit|kill|stop
//                     [--timeout_ms=120000] [--memif_dir=DIR] (dpdk: memif socket folder)
//                     [--peer_dead_ms=N] (udp: a silence bound, EngineOptions::peer_dead; default none)
//                     [--ballast_mb=N] (hold N MiB of touched memory, as a training process)
//
// before: the victim dies right after connecting; between: after 3 collectives; during:
// a thread of the victim kills it 1 ms into its 4th collective. exit = _exit(0), kill =
// SIGKILL, stop = SIGSTOP (a host that stops answering; the parent kills it later).
// Files in --info: died.V (realtime ms just before the victim dies), rss.V (its resident
// MiB then), and for each
// survivor failed.R (realtime ms of its IoException) and message.R (the exception text).
// Exit codes: 0 survivor raised gloo::IoException; 1 wrong result or other exception;
// 2 bad arguments/setup; 4 no exception after many collectives.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/allreduce.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/device.h"
#ifdef OPTIREDUCE_HAVE_DPDK
#include "transport_dpdk/io/dpdk/dpdk_control_gate.h"
#endif
#ifdef OPTIREDUCE_HAVE_DPDK
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"
#endif

namespace {

std::map<std::string, std::string> g_args;

long long RealtimeMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

void WriteFile(const std::string& name, const std::string& text) {
  const std::string path = g_args["info"] + "/" + name;
  std::ofstream(path + ".tmp") << text;
  rename((path + ".tmp").c_str(), path.c_str());
}

// Resident memory of this process in MiB (/proc/self/statm).
long ResidentMiB() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE) / (1 << 20);
}

[[noreturn]] void Die(int rank) {
  // The kernel closes a killed process's sockets only after it freed its memory, so
  // how soon a peer can notice depends on this (see peer_death_bench).
  WriteFile("rss." + std::to_string(rank), std::to_string(ResidentMiB()) + "\n");
  WriteFile("died." + std::to_string(rank), std::to_string(RealtimeMs()) + "\n");
  const std::string how = g_args["how"];
  if (how == "kill") raise(SIGKILL);
  if (how == "stop") {
    raise(SIGSTOP);
    for (;;) pause();  // the parent kills it
  }
  _exit(0);
}

void SumFn(void* c, const void* a, const void* b, size_t n) { gloo::sum<int32_t>(c, a, b, n); }

// One collective of kind `op`, iteration `i`; returns "" or what was wrong.
std::string RunOp(const std::string& op, const std::shared_ptr<gloo::Context>& ctx, int i) {
  const int r = ctx->rank, n = ctx->size;
  constexpr size_t kElems = 1 << 16;
  const uint64_t slot = 1000 + 4 * static_cast<uint64_t>(i);
  if (op == "allreduce") {
    std::vector<int32_t> v(kElems, r + i);
    gloo::AllreduceOptions o(ctx);
    o.setOutput(v.data(), v.size());
    o.setReduceFunction(&SumFn);
    o.setTag(static_cast<uint32_t>(i));
    gloo::allreduce(o);
    const int32_t want = n * (n - 1) / 2 + n * i;
    return v[0] == want && v[kElems - 1] == want ? "" : "allreduce gave a wrong sum";
  }
  if (op == "optireduce") {
    // OptiReduce mode past calibration (2 reliable operations, then bounded): a dead peer is
    // an error there too, while loss and lateness are absorbed.
    static const auto policy = [] {
      optireduce::TimeoutOptions t;
      t.calibration_ops = 2;
      t.min_bound = std::chrono::milliseconds(300);
      t.hard_cap = std::chrono::seconds(1);
      return std::make_shared<optireduce::TimeoutPolicy>(t);
    }();
    std::vector<float> v(kElems, static_cast<float>(r + i));
    optireduce::AllreduceOptions o(ctx);
    o.setOutput(v.data(), v.size());
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
        &gloo::sum<float>));
    o.setMode(optireduce::AllreduceOptions::Mode::kBounded);
    o.setTimeoutPolicy(policy);
    o.setTag(5);
    optireduce::allreduce(o);
    for (float x : v) {
      if (!std::isfinite(x)) return "OptiReduce mode gave a non-finite value";
    }
    return "";
  }
  if (op == "broadcast") {
    std::vector<int32_t> v(kElems, r == 0 ? i : -1);
    gloo::BroadcastOptions o(ctx);
    o.setOutput(v.data(), v.size());
    o.setRoot(0);
    o.setTag(static_cast<uint32_t>(i));
    gloo::broadcast(o);
    return v[0] == i && v[kElems - 1] == i ? "" : "broadcast gave wrong data";
  }
  if (op == "barrier") {
    gloo::BarrierOptions o(ctx);
    o.setTag(static_cast<uint32_t>(i));
    gloo::barrier(o);
    return "";
  }
  if (op == "sendrecv") {
    std::vector<int32_t> out(kElems, r * 1000 + i), in(kElems, -1);
    auto sb = ctx->createUnboundBuffer(out.data(), out.size() * sizeof(int32_t));
    auto rb = ctx->createUnboundBuffer(in.data(), in.size() * sizeof(int32_t));
    const int prev = (r + n - 1) % n;
    rb->recv(prev, slot);
    sb->send((r + 1) % n, slot);
    rb->waitRecv();
    sb->waitSend();
    return in[0] == prev * 1000 + i ? "" : "sendrecv gave wrong data";
  }
  if (op == "recv_any") {
    // Rank 0 takes one message from each other rank through recv-from-any, then answers.
    int32_t v = r * 1000 + i;
    auto ub = ctx->createUnboundBuffer(&v, sizeof(v));
    if (r == 0) {
      std::vector<int> others;
      for (int k = 1; k < n; ++k) others.push_back(k);
      std::vector<bool> seen(n, false);
      for (int k = 1; k < n; ++k) {
        ub->recv(others, slot);
        int from = -1;
        ub->waitRecv(&from);
        if (from < 1 || from >= n || seen[from] || v != from * 1000 + i) {
          return "recv-from-any gave a wrong message";
        }
        seen[from] = true;
      }
      v = i;
      for (int k = 1; k < n; ++k) ub->send(k, slot + 1);
      for (int k = 1; k < n; ++k) ub->waitSend();
      return "";
    }
    ub->send(0, slot);
    ub->waitSend();
    ub->recv(0, slot + 1);
    ub->waitRecv();
    return v == i ? "" : "recv-from-any answer wrong";
  }
  if (op == "buffer_recv") {
    // Old-style Buffers, as Gloo's algorithm classes use them (made once, reused): the
    // victim sends one value to every other rank per collective, and they only wait in
    // Buffer::waitRecv (nothing of theirs is in flight to it).
    const int sender = std::stoi(g_args["victim"]);
    constexpr uint64_t kBufferSlot = 77;
    static std::vector<int32_t> values(n, -1);
    static std::vector<std::unique_ptr<gloo::transport::Buffer>> bufs(n);
    if (r == sender) {
      for (int k = 0; k < n; ++k) {
        if (k == r) continue;
        if (!bufs[k]) {
          bufs[k] = ctx->getPair(k)->createSendBuffer(kBufferSlot, &values[k], sizeof(int32_t));
        }
        values[k] = i;
        bufs[k]->send();
      }
      for (int k = 0; k < n; ++k) {
        if (k != r) bufs[k]->waitSend();
      }
      return "";
    }
    if (!bufs[sender]) {
      bufs[sender] =
          ctx->getPair(sender)->createRecvBuffer(kBufferSlot, &values[sender], sizeof(int32_t));
    }
    bufs[sender]->waitRecv();
    // The sender may already have sent the next value into the same buffer.
    return values[sender] >= i ? "" : "old-style buffer recv gave wrong data";
  }
  return "unknown op " + op;
}

// --op=idle: three barriers, then the victim dies and the others stay idle (nothing posted)
// for 2 s with one live and one dead peer; each writes cpu.R: "<progress thread s>
// <process s> <wall s> <progress loop rounds> <control gate rounds>" (progress thread
// and rounds -1 on Gloo's TCP device, which has none of ours; gate rounds -1 without a
// DPDK control gate in the process).
int Idle(const std::shared_ptr<gloo::Context>& ctx, int victim) {
  for (int i = 0; i < 3; ++i) RunOp("barrier", ctx, i);
  if (ctx->rank == victim) Die(ctx->rank);
  const std::string died = g_args["info"] + "/died." + std::to_string(victim);
  for (int k = 0; k < 30000 && access(died.c_str(), F_OK) != 0; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto* ours = dynamic_cast<optireduce::transport::Device*>(ctx->getDevice().get());
  auto process_cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  auto polls = [&]() -> long long {
    return ours ? static_cast<long long>(ours->stats().progress_polls) : -1;
  };
  auto gate_rounds = []() -> long long {
#ifdef OPTIREDUCE_HAVE_DPDK
    if (g_args["device"] == "dpdk") {
      auto gate = optireduce::transport::dpdk::ControlGate::Get();
      if (gate.ok()) return static_cast<long long>((*gate)->parks());
    }
#endif
    return -1;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double t0 = ours ? ours->ProgressThreadCpuSeconds() : 0, p0 = process_cpu();
  const long long polls0 = polls(), gate0 = gate_rounds();
  const auto w0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  const double thread = ours ? ours->ProgressThreadCpuSeconds() - t0 : -1;
  const long long polls1 = polls(), gate1 = gate_rounds();
  WriteFile("cpu." + std::to_string(ctx->rank),
            std::to_string(thread) + " " + std::to_string(process_cpu() - p0) + " " +
                std::to_string(wall) + " " + std::to_string(polls0 < 0 ? -1 : polls1 - polls0) +
                " " + std::to_string(gate0 < 0 ? -1 : gate1 - gate0) + "\n");
  // Leave without tearing down: the context would wait for the dead peer's linger.
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) {
      fprintf(stderr, "peer_death_worker: bad argument '%s' (want --key=value)\n", argv[i]);
      return 2;
    }
    g_args[a.substr(2, a.find('=') - 2)] = a.substr(a.find('=') + 1);
  }
  // As in a Python (torch) process: a write to a socket the dead peer closed must not kill
  // the survivor (Gloo's TCP pair writes without MSG_NOSIGNAL).
  signal(SIGPIPE, SIG_IGN);
  const int rank = std::stoi(g_args["rank"]);
  const int size = std::stoi(g_args["size"]);
  const int victim = std::stoi(g_args["victim"]);
  const std::string op = g_args["op"], at = g_args["at"], device_kind = g_args["device"];
  const auto timeout = std::chrono::milliseconds(
      g_args.count("timeout_ms") ? std::stol(g_args["timeout_ms"]) : 120000);
  try {
    std::shared_ptr<gloo::transport::Device> device;
    if (device_kind == "tcp") {
      gloo::transport::tcp::attr t;
      t.hostname = "127.0.0.1";
      device = gloo::transport::tcp::CreateDevice(t);
    } else if (device_kind == "udp") {
      optireduce::transport::EngineOptions engine;
      if (g_args.count("peer_dead_ms")) {
        engine.peer_dead = std::chrono::milliseconds(std::stol(g_args["peer_dead_ms"]));
      }
      auto d = optireduce::transport::udp::CreateDeviceOrError(
          optireduce::transport::udp::attr(), engine);
      if (!d.ok()) {
        fprintf(stderr, "rank %d: %s\n", rank, d.status().ToString().c_str());
        return 2;
      }
      device = *d;
    } else if (device_kind == "dpdk") {
#ifdef OPTIREDUCE_HAVE_DPDK
      namespace dpdk = optireduce::transport::dpdk;
      dpdk::attr a;
      a.eal_args = dpdk::MemifMeshEalArgs(g_args["memif_dir"], rank, size) + " " +
                   dpdk::DefaultEalArgs();
      auto d = dpdk::CreateDeviceOrError(a);
      if (!d.ok()) {
        fprintf(stderr, "rank %d: %s\n", rank, d.status().ToString().c_str());
        return 2;
      }
      device = *d;
#else
      fprintf(stderr, "built without DPDK\n");
      return 2;
#endif
    } else {
      fprintf(stderr, "unknown --device=%s\n", device_kind.c_str());
      return 2;
    }
    gloo::rendezvous::FileStore store(g_args["store"]);
    auto ctx = optireduce::testing::ConnectContext(store, device, rank, size, timeout);
    if (g_args.count("ballast_mb")) {
      // Memory held (and touched) for the rest of the run, like a training process's.
      static std::vector<char> ballast;
      ballast.assign(static_cast<size_t>(std::stol(g_args["ballast_mb"])) << 20, 1);
    }
    WriteFile("ready." + std::to_string(rank), "1\n");
    if (rank == victim && at == "before") {
      // Die only once every rank is connected (Gloo's TCP connect fails otherwise).
      for (int r = 0; r < size; ++r) {
        const std::string path = g_args["info"] + "/ready." + std::to_string(r);
        for (int k = 0; k < 30000 && access(path.c_str(), F_OK) != 0; ++k) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    }
    if (op == "idle") return Idle(ctx, victim);
    for (int i = 0; i < 100000; ++i) {
      if (rank == victim) {
        if ((at == "before" && i == 0) || (at == "between" && i == 3)) Die(rank);
        if (at == "during" && i == 3) {
          std::thread([rank] {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            Die(rank);
          }).detach();
        }
      }
      std::string err;
      try {
        err = RunOp(op, ctx, i);
      } catch (const gloo::IoException& e) {
        const long long now = RealtimeMs();
        if (rank == victim) {
          fprintf(stderr, "rank %d (victim): IoException: %s\n", rank, e.what());
          return 1;
        }
        WriteFile("message." + std::to_string(rank), e.what());
        WriteFile("failed." + std::to_string(rank), std::to_string(now) + "\n");
        // Stay until every survivor has raised: this process's exit takes its links down
        // (memif), and a survivor still judging the dead rank would see that first.
        for (int r = 0; r < size; ++r) {
          const std::string path = g_args["info"] + "/failed." + std::to_string(r);
          for (int k = 0; r != victim && k < 30000 && access(path.c_str(), F_OK) != 0; ++k) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        return 0;
      }
      if (!err.empty()) {
        fprintf(stderr, "rank %d: iteration %d: %s\n", rank, i, err.c_str());
        return 1;
      }
    }
    fprintf(stderr, "rank %d: no exception after 100000 collectives\n", rank);
    return 4;
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %d: exception: %s\n", rank, e.what());
    return 1;
  }
}
