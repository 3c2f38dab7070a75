// latency_bench: where a small message's time goes. Local ranks (processes), through the
// Gloo API only, on each transport:
//   - ping-pong of one UnboundBuffer message between rank pairs (0<->1, 2<->3, ...):
//     round trip (p50/p99) and one-way time (the sender's CLOCK_MONOTONIC stamp in the
//     payload, read by the receiver when its waitRecv returns; messages of 8 bytes and
//     more), per message size;
//   - gloo::barrier, gloo::allreduce and optireduce::allreduce of 4 bytes (p50/p99);
//   - device set-up and tear-down: create the device, connectFullMesh, destroy the
//     context and the device (each rank set in fresh processes; dpdk's create includes
//     the EAL's initialisation);
//   - for the datagram transports, the engine's packets and acks per ping-pong message
//     and the progress thread's CPU time per round trip.
// A transport name may carry "+busy" (udp+busy, dpdk+busy): the progress thread never
// sleeps, so the difference to the plain row is what its wake-ups cost; or "+nospin": it
// sleeps (waits for input) as soon as it has nothing to do.
//
//   latency_bench [--ranks 2] [--transports tcp,udp,dpdk,udp+busy,dpdk+busy]
//                 [--sizes 4,4K,64K] [--iters 2000] [--setup-trials 5] [--csv FILE]
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "algorithms/allreduce.h"
#include "bench/local_ranks.h"
#if __has_include("transport_dpdk/device.h")
#include "transport_dpdk/device.h"
#define LATENCY_BENCH_HAVE_ENGINE 1
#endif

namespace optireduce {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using RawFunc = void (*)(void*, const void*, const void*, size_t);

struct Config {
  int ranks = 2;
  std::vector<std::string> transports = {"tcp", "udp", "dpdk", "udp+busy", "dpdk+busy"};
  std::vector<size_t> sizes = {4, 4 << 10, 64 << 10};
  int iters = 2000;
  int setup_trials = 5;
  std::string csv;
};

// One result line: transport, what, size, p50 us, p99 us, extra (free text).
struct Line {
  std::string transport, what;
  size_t bytes = 0;
  double p50 = 0, p99 = 0;
  std::string extra;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t idx = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[idx];
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void Append(const std::string& path, const Line& l) {
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return;
  std::fprintf(f, "%s\t%s\t%zu\t%.2f\t%.2f\t%s\n", l.transport.c_str(), l.what.c_str(), l.bytes,
               l.p50, l.p99, l.extra.c_str());
  std::fclose(f);
}

// Splits "udp+busy" into the transport and whether the progress thread busy-polls.
DeviceSpec SpecOf(const std::string& name, const std::string& dir, int rank, int size) {
  DeviceSpec spec;
  const size_t plus = name.find('+');
  spec.transport = name.substr(0, plus);
  const std::string variant = plus == std::string::npos ? "" : name.substr(plus + 1);
  spec.busy_poll = variant == "busy";
  if (variant == "nospin") spec.spin = std::chrono::microseconds(0);
  spec.hostname = "127.0.0.1";
  UseLocalMemifMesh(&spec, dir, rank, size);
  return spec;
}

struct EngineSample {
  uint64_t tx = 0, acks = 0;
  double cpu = 0;
  bool have = false;
};

EngineSample Sample(const std::shared_ptr<gloo::transport::Device>& dev) {
  EngineSample s;
#ifdef LATENCY_BENCH_HAVE_ENGINE
  if (auto* d = dynamic_cast<optireduce::transport::Device*>(dev.get())) {
    const auto st = d->stats();
    s.tx = st.tx_packets;
    s.acks = st.acks_sent;
    s.cpu = d->engine()->ProgressThreadCpuSeconds();
    s.have = true;
  }
#else
  (void)dev;
#endif
  return s;
}

void PingPong(const std::shared_ptr<gloo::Context>& ctx,
              const std::shared_ptr<gloo::transport::Device>& dev, const std::string& name,
              size_t bytes, int iters, const std::string& out) {
  const int peer = ctx->rank ^ 1;
  if (peer >= ctx->size) return;
  const bool initiator = ctx->rank % 2 == 0;
  std::vector<char> sbuf(std::max<size_t>(bytes, 8)), rbuf(sbuf.size());
  auto sb = ctx->createUnboundBuffer(sbuf.data(), bytes);
  auto rb = ctx->createUnboundBuffer(rbuf.data(), bytes);
  const uint64_t slot = 100 + bytes;
  std::vector<double> rtt, oneway;
  const int warm = std::max(10, iters / 20);
  EngineSample before;
  for (int it = -warm; it < iters; ++it) {
    if (it == 0) before = Sample(dev);
    if (initiator) {
      rb->recv(peer, slot);
      const int64_t t0 = NowNs();
      if (bytes >= 8) std::memcpy(sbuf.data(), &t0, 8);
      sb->send(peer, slot);
      sb->waitSend();
      rb->waitRecv();
      const int64_t t1 = NowNs();
      if (it >= 0) {
        rtt.push_back((t1 - t0) / 1e3);
        if (bytes >= 8) {
          int64_t sent;
          std::memcpy(&sent, rbuf.data(), 8);
          oneway.push_back((t1 - sent) / 1e3);
        }
      }
    } else {
      rb->recv(peer, slot);
      rb->waitRecv();
      const int64_t t1 = NowNs();
      if (it >= 0 && bytes >= 8) {
        int64_t sent;
        std::memcpy(&sent, rbuf.data(), 8);
        oneway.push_back((t1 - sent) / 1e3);
      }
      const int64_t t2 = NowNs();
      if (bytes >= 8) std::memcpy(sbuf.data(), &t2, 8);
      sb->send(peer, slot);
      sb->waitSend();
    }
  }
  const EngineSample after = Sample(dev);
  if (ctx->rank != 0) return;
  std::ostringstream extra;
  if (after.have) {
    // Two messages per round trip (one each way); this rank's packets and acks.
    const double per = 1.0 / (2.0 * iters);
    extra << "pkts/msg " << 2 * (after.tx - before.tx) * per << " acks/msg "
          << 2 * (after.acks - before.acks) * per << " progress-cpu/rtt "
          << (after.cpu - before.cpu) * 1e6 / iters << " us";
  }
  Append(out, {name, "pingpong rtt", bytes, Percentile(rtt, 0.5), Percentile(rtt, 0.99),
               extra.str()});
  if (!oneway.empty()) {
    Append(out, {name, "one-way", bytes, Percentile(oneway, 0.5), Percentile(oneway, 0.99), ""});
  }
}

void Collectives(const std::shared_ptr<gloo::Context>& ctx, const std::string& name, int iters,
                 const std::string& out) {
  std::vector<double> bar, ar, tar;
  float v = 1.0f;
  const int warm = std::max(10, iters / 20);
  for (int it = -warm; it < iters; ++it) {
    auto t0 = Clock::now();
    gloo::BarrierOptions b(ctx);
    b.setTag(3);
    gloo::barrier(b);
    auto t1 = Clock::now();
    if (it >= 0) bar.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  for (int it = -warm; it < iters; ++it) {
    v = 1.0f;
    auto t0 = Clock::now();
    gloo::AllreduceOptions o(ctx);
    o.setOutput(&v, 1);
    o.setReduceFunction(RawFunc(&gloo::sum<float>));
    o.setTag(4);
    gloo::allreduce(o);
    auto t1 = Clock::now();
    if (v != static_cast<float>(ctx->size)) throw std::runtime_error("gloo::allreduce: wrong sum");
    if (it >= 0) ar.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  for (int it = -warm; it < iters; ++it) {
    v = 1.0f;
    auto t0 = Clock::now();
    optireduce::AllreduceOptions o(ctx);
    o.setOutput(&v, 1);
    o.setReduceFunction(RawFunc(&gloo::sum<float>));
    o.setTag(5);
    optireduce::allreduce(o);
    auto t1 = Clock::now();
    if (v != static_cast<float>(ctx->size))
      throw std::runtime_error("optireduce::allreduce: wrong sum");
    if (it >= 0) tar.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (ctx->rank != 0) return;
  Append(out, {name, "barrier", 0, Percentile(bar, 0.5), Percentile(bar, 0.99), ""});
  Append(out, {name, "gloo::allreduce", 4, Percentile(ar, 0.5), Percentile(ar, 0.99), ""});
  Append(out, {name, "optireduce::allreduce", 4, Percentile(tar, 0.5), Percentile(tar, 0.99), ""});
}

int Measure(const Config& cfg, const std::string& name, const std::string& out) {
  return ForkLocalRanks(cfg.ranks, 600, [&](int rank, const std::string& dir) {
    gloo::rendezvous::FileStore store(dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, cfg.ranks);
    ctx->setTimeout(std::chrono::seconds(120));
    auto dev = MakeDevice(SpecOf(name, dir, rank, cfg.ranks));
    ctx->connectFullMesh(store, dev);
    for (size_t bytes : cfg.sizes) {
      const int iters = bytes > (16 << 10) ? std::max(50, cfg.iters / 4) : cfg.iters;
      PingPong(ctx, dev, name, bytes, iters, out);
      gloo::BarrierOptions b(ctx);
      b.setTag(2);
      gloo::barrier(b);
    }
    Collectives(ctx, name, cfg.iters, out);
    return 0;
  });
}

// Set-up and tear-down, each trial in fresh processes; rank 0's times.
int SetupTeardown(const Config& cfg, const std::string& name, const std::string& out) {
  std::vector<double> create, connect, destroy, total;
  int rc = 0;
  for (int t = 0; t < cfg.setup_trials && rc == 0; ++t) {
    const std::string times = out + ".setup";
    std::remove(times.c_str());
    rc = ForkLocalRanks(cfg.ranks, 120, [&](int rank, const std::string& dir) {
      gloo::rendezvous::FileStore store(dir);
      const DeviceSpec spec = SpecOf(name, dir, rank, cfg.ranks);
      const auto t0 = Clock::now();
      auto dev = MakeDevice(spec);
      const auto t1 = Clock::now();
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, cfg.ranks);
      ctx->setTimeout(std::chrono::seconds(60));
      ctx->connectFullMesh(store, dev);
      // One collective, so the context has carried traffic when it is destroyed.
      {
        gloo::BarrierOptions b(ctx);  // holds the context: gone before the tear-down
        b.setTag(1);
        gloo::barrier(b);
      }
      const auto t2 = Clock::now();
      ctx.reset();
      dev.reset();
      const auto t3 = Clock::now();
      if (rank == 0) {
        auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
        std::ofstream(times) << ms(t1 - t0) << " " << ms(t2 - t1) << " " << ms(t3 - t2) << "\n";
      }
      return 0;
    });
    std::ifstream f(times);
    double a, b, c;
    if (f >> a >> b >> c) {
      create.push_back(a);
      connect.push_back(b);
      destroy.push_back(c);
      total.push_back(a + b + c);
    }
    std::remove(times.c_str());
  }
  auto ms = [](const std::vector<double>& v) { return Percentile(v, 0.5) * 1e3; };  // us
  Append(out, {name, "setup: create", 0, ms(create), Percentile(create, 1) * 1e3, ""});
  Append(out, {name, "setup: connectFullMesh", 0, ms(connect), Percentile(connect, 1) * 1e3, ""});
  Append(out, {name, "teardown: destroy", 0, ms(destroy), Percentile(destroy, 1) * 1e3, ""});
  Append(out, {name, "setup+teardown", 0, ms(total), Percentile(total, 1) * 1e3, ""});
  return rc;
}

bool ParseSize(const std::string& text, size_t* out) {
  if (text.empty()) return false;
  size_t mult = 1;
  std::string digits = text;
  const char unit = static_cast<char>(std::toupper(text.back()));
  if (unit == 'K' || unit == 'M') {
    mult = unit == 'K' ? 1 << 10 : 1 << 20;
    digits.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v)) return false;
  *out = v * mult;
  return true;
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: latency_bench [--ranks N (2..8)] [--transports "
               "tcp,udp,dpdk,udp+busy,dpdk+busy] [--sizes 4,4K,64K] [--iters N] "
               "[--setup-trials N] [--csv FILE]\navailable transports: %s\n",
               why.c_str(), AvailableTransports().c_str());
  return 2;
}

}  // namespace
}  // namespace bench
}  // namespace optireduce

int main(int argc, char** argv) {
  using namespace optireduce::bench;
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    ++i;
    if (arg == "--ranks") {
      if (!absl::SimpleAtoi(value, &cfg.ranks) || cfg.ranks < 2 || cfg.ranks > 8)
        return Usage("--ranks takes a number from 2 to 8");
    } else if (arg == "--transports") {
      cfg.transports = absl::StrSplit(value, ',');
      for (const std::string& t : cfg.transports) {
        const std::string base = t.substr(0, t.find('+'));
        const std::string suffix = t.find('+') == std::string::npos ? "" : t.substr(t.find('+'));
        if (base.empty() || AvailableTransports().find(base) == std::string::npos ||
            (!suffix.empty() && ((suffix != "+busy" && suffix != "+nospin") || base == "tcp")))
          return Usage("--transports: '" + t + "' is not available");
      }
    } else if (arg == "--sizes") {
      cfg.sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        size_t b = 0;
        if (!ParseSize(std::string(s), &b) || b < 1 || b > (64 << 20))
          return Usage("--sizes: bad size '" + std::string(s) + "' (1 byte .. 64M)");
        cfg.sizes.push_back(b);
      }
    } else if (arg == "--iters") {
      if (!absl::SimpleAtoi(value, &cfg.iters) || cfg.iters < 10)
        return Usage("--iters takes a number >= 10");
    } else if (arg == "--setup-trials") {
      if (!absl::SimpleAtoi(value, &cfg.setup_trials) || cfg.setup_trials < 1)
        return Usage("--setup-trials takes a positive number");
    } else if (arg == "--csv") {
      cfg.csv = value;
      if (cfg.csv.empty()) return Usage("--csv needs a file name");
    } else {
      return Usage("unknown argument '" + arg + "'");
    }
  }
  char tmpl[] = "/tmp/optireduce-latency-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string out = std::string(tmpl) + "/lines";
  int rc = 0;
  for (const std::string& t : cfg.transports) {
    std::fprintf(stderr, "latency over %s on %d ranks...\n", t.c_str(), cfg.ranks);
    if (Measure(cfg, t, out) != 0) {
      std::fprintf(stderr, "latency_bench: %s failed\n", t.c_str());
      rc = 1;
    }
    if (SetupTeardown(cfg, t, out) != 0) {
      std::fprintf(stderr, "latency_bench: set-up/tear-down of %s failed\n", t.c_str());
      rc = 1;
    }
  }
  std::printf("\nlatency through the Gloo API: %d ranks (local processes); us; ping-pong between "
              "rank pairs (0<->1, ...), rank 0's view\n\n",
              cfg.ranks);
  std::printf("%-10s %-24s %8s %10s %10s  %s\n", "transport", "what", "bytes", "p50 us",
              "p99/max us", "engine (rank 0)");
  std::ifstream f(out);
  std::string line;
  FILE* csv = cfg.csv.empty() ? nullptr : std::fopen(cfg.csv.c_str(), "w");
  if (csv) std::fprintf(csv, "transport,ranks,what,bytes,p50_us,p99_us,engine\n");
  while (std::getline(f, line)) {
    std::vector<std::string> c = absl::StrSplit(line, '\t');
    if (c.size() < 6) continue;
    std::printf("%-10s %-24s %8s %10s %10s  %s\n", c[0].c_str(), c[1].c_str(), c[2].c_str(),
                c[3].c_str(), c[4].c_str(), c[5].c_str());
    if (csv) std::fprintf(csv, "%s,%d,%s,%s,%s,%s,%s\n", c[0].c_str(), cfg.ranks, c[1].c_str(),
                          c[2].c_str(), c[3].c_str(), c[4].c_str(), c[5].c_str());
  }
  if (csv) std::fclose(csv);
  std::remove(out.c_str());
  rmdir(tmpl);
  return rc;
}
