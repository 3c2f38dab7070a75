// loss_model_bench: loss recovery on the deterministic path model
// (transport_dpdk/reliable/path_model.h): one 4 MiB message per seed, the engine's
// sender and receiver components, no host noise. Per fault pattern: p50/p99 of the
// completion time over the seeds, p99 over the lossless p50, retransmitted / lost bytes,
// RTOs, spurious RTOs, tail-loss probes and the largest RTO reached.
//
//   loss_model_bench [--seeds=200] [--stalls]   (--stalls: both ends are descheduled
//                                               for 2-20 ms every 50 ms on average)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transport_dpdk/reliable/path_model.h"

using optireduce::transport::PathModelConfig;
using optireduce::transport::PathModelResult;
using optireduce::transport::RunPathModel;
using us = std::chrono::microseconds;

namespace {

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  int seeds = 200;
  bool stalls = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--seeds=", 8) == 0) {
      seeds = std::atoi(argv[i] + 8);
    } else if (std::strcmp(argv[i], "--stalls") == 0) {
      stalls = true;
    } else {
      std::fprintf(stderr, "unknown argument '%s' (allowed: --seeds=N --stalls)\n", argv[i]);
      return 2;
    }
  }
  if (seeds < 1) {
    std::fprintf(stderr, "--seeds must be >= 1\n");
    return 2;
  }
  struct Pattern {
    const char* name;
    double drop, burst, ack;
  };
  const Pattern patterns[] = {{"none", 0, 0, 0},
                              {"1% random", 0.01, 0, 0},
                              {"1% burst (mean 8)", 0, 0.01, 0},
                              {"5% ack-only", 0, 0, 0.05}};
  double lossless_p50 = 0;
  std::printf("%-20s %9s %9s %9s %8s %8s %8s %8s %8s %8s %6s\n", "pattern", "p50 us", "p99 us",
              "p99/p50_0", "retx/lost", "rto/op", "spurRTO", "tlp/op", "spur/op", "maxRTO", "fail");
  for (const Pattern& pat : patterns) {
    std::vector<double> t;
    double retx = 0, lost = 0, rto = 0, srto = 0, tlp = 0, spur = 0, max_rto = 0;
    int fail = 0;
    for (int k = 0; k < seeds; ++k) {
      PathModelConfig c = PathModelConfig::Defaults();
      c.drop = pat.drop;
      c.burst_loss = pat.burst;
      c.ack_drop = pat.ack;
      c.seed = static_cast<uint64_t>(k + 1);
      if (stalls) {
        c.stall_every = us(50000);
        c.stall_min = us(2000);
        c.stall_max = us(20000);
      }
      const PathModelResult r = RunPathModel(c);
      if (!r.completed) ++fail;
      t.push_back(static_cast<double>(r.elapsed.count()));
      retx += static_cast<double>(r.sender.retransmitted_bytes);
      lost += static_cast<double>(r.data_bytes_dropped);
      rto += static_cast<double>(r.sender.rto_events);
      srto += static_cast<double>(r.sender.spurious_rtos);
      tlp += static_cast<double>(r.sender.tlp_probes);
      spur += static_cast<double>(r.sender.spurious);
      max_rto = std::max(max_rto, static_cast<double>(r.max_rto.count()));
    }
    const double p50 = Pct(t, 0.5), p99 = Pct(t, 0.99);
    if (lossless_p50 == 0) lossless_p50 = p50;
    std::printf("%-20s %9.0f %9.0f %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.0f %6d\n", pat.name,
                p50, p99, p99 / lossless_p50, lost > 0 ? retx / lost : 0.0, rto / seeds,
                srto / seeds, tlp / seeds, spur / seeds, max_rto, fail);
  }
  return 0;
}
