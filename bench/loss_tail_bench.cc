// loss_tail_bench: where the tail of TAR over our UDP transport comes from under
// injected loss. Local ranks (processes) on 127.0.0.1, faults from OPTIREDUCE_FAULTS
// (transport_dpdk/io/fault_injector.h), one exact TAR per iteration.
//
//   loss_tail_bench [--ranks=4] [--elements=4194304] [--iters=100] [--warmup=5]
//                   [--slowest=8]
//
// Prints rank 0's p50/p99/max per-operation time, the loss-recovery counters of all
// ranks summed over the timed operations (retransmitted / dropped data bytes, RTOs,
// tail-loss probes, RACK marks, spurious retransmissions and RTOs, silences of at least
// the RTO floor), and the same counters per operation for the slowest operations next
// to the median one: which mechanism a slow operation waited on.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "algorithms/allreduce.h"
#include "bench/local_ranks.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/io/fault_injector.h"

namespace {

using Clock = std::chrono::steady_clock;

// One operation's counters on one rank (deltas over the operation).
enum Field {
  kUs,
  kRetxBytes,
  kDroppedBytes,
  kRto,
  kTlp,
  kRack,
  kSpurious,
  kSpuriousRto,
  kSilences,
  kSilenceUs,
  kLocalDrops,
  kAckDrops,
  kFields
};
const char* const kNames[kFields] = {"us",      "retx_B",    "lost_B", "rto",
                                     "tlp",     "rack",      "spur",   "spur_rto",
                                     "silence", "silence_us", "local",  "ack_drop"};

struct Snapshot {
  optireduce::transport::Stats s;
  uint64_t dropped_bytes = 0, ack_drops = 0;
};

Snapshot Take(optireduce::transport::Device* d) {
  Snapshot x;
  x.s = d->stats();
  if (auto* f = dynamic_cast<optireduce::transport::FaultInjector*>(d->engine()->io())) {
    x.dropped_bytes = f->counters().data_bytes_dropped.load();
    x.ack_drops = f->counters().acks_dropped.load();
  }
  return x;
}

void Delta(const Snapshot& a, const Snapshot& b, double* row) {
  row[kRetxBytes] = static_cast<double>(b.s.retransmitted_bytes - a.s.retransmitted_bytes);
  row[kDroppedBytes] = static_cast<double>(b.dropped_bytes - a.dropped_bytes);
  row[kRto] = static_cast<double>(b.s.rto_events - a.s.rto_events);
  row[kTlp] = static_cast<double>(b.s.tlp_probes - a.s.tlp_probes);
  row[kRack] = static_cast<double>(b.s.fast_retransmits - a.s.fast_retransmits);
  row[kSpurious] = static_cast<double>(b.s.spurious_retransmits - a.s.spurious_retransmits);
  row[kSpuriousRto] = static_cast<double>(b.s.spurious_rtos - a.s.spurious_rtos);
  row[kSilences] = static_cast<double>(b.s.long_silences - a.s.long_silences);
  row[kSilenceUs] = static_cast<double>(b.s.long_silence_us - a.s.long_silence_us);
  row[kLocalDrops] = static_cast<double>(b.s.tx_backpressure - a.s.tx_backpressure);
  row[kAckDrops] = static_cast<double>(b.ack_drops - a.ack_drops);
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

int Flag(const std::map<std::string, std::string>& a, const char* k, int def) {
  auto it = a.find(k);
  return it == a.end() ? def : std::atoi(it->second.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    const size_t eq = s.find('=');
    if (s.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument '%s' (expected --name=value)\n", s.c_str());
      return 2;
    }
    const std::string key = s.substr(2, eq - 2);
    if (key != "ranks" && key != "elements" && key != "iters" && key != "warmup" &&
        key != "slowest") {
      std::fprintf(stderr,
                   "unknown flag --%s (allowed: --ranks --elements --iters --warmup "
                   "--slowest)\n",
                   key.c_str());
      return 2;
    }
    a[key] = s.substr(eq + 1);
  }
  const int ranks = Flag(a, "ranks", 4), iters = Flag(a, "iters", 100),
            warmup = Flag(a, "warmup", 5), slowest = Flag(a, "slowest", 8);
  const size_t elements = static_cast<size_t>(Flag(a, "elements", 4194304));
  if (ranks < 2 || iters < 1 || warmup < 0 || elements < 1) {
    std::fprintf(stderr, "need --ranks >= 2, --iters >= 1, --warmup >= 0, --elements >= 1\n");
    return 2;
  }
  return optireduce::bench::RunLocalRanks(
      ranks, "udp", 600, [&](const optireduce::bench::RankEnv& env) {
        auto* dev = dynamic_cast<optireduce::transport::Device*>(
            env.context->getDevice().get());
        if (!dev) {
          std::fprintf(stderr, "rank %d: not our udp device\n", env.rank);
          return 1;
        }
        std::vector<float> buf(elements);
        std::vector<double> rows(static_cast<size_t>(iters) * kFields, 0.0);
        auto run = [&](uint32_t tag) {
          for (size_t i = 0; i < elements; ++i) buf[i] = static_cast<float>((i + env.rank) % 7);
          optireduce::AllreduceOptions opts(env.context);
          opts.setOutput(buf.data(), elements);
          opts.setReduceFunction(
              static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          opts.setTag(tag);
          opts.setTimeout(std::chrono::seconds(120));
          opts.setHadamard(optireduce::AllreduceOptions::Hadamard::kOff);
          optireduce::allreduce(opts);
        };
        for (int i = 0; i < warmup; ++i) run(1);
        for (int i = 0; i < iters; ++i) {
          const Snapshot before = Take(dev);
          const auto t0 = Clock::now();
          run(1);
          const auto t1 = Clock::now();
          const Snapshot after = Take(dev);
          double* row = &rows[static_cast<size_t>(i) * kFields];
          row[kUs] = std::chrono::duration<double, std::micro>(t1 - t0).count();
          Delta(before, after, row);
        }
        // Exactness of the last one: sum over ranks of (i + r) % 7.
        for (size_t i = 0; i < elements; i += 997) {
          float want = 0;
          for (int r = 0; r < ranks; ++r) want += static_cast<float>((i + r) % 7);
          if (buf[i] != want) {
            std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", env.rank, i,
                         buf[i], want);
            return 1;
          }
        }
        std::vector<double> all(rows.size() * ranks);
        gloo::AllgatherOptions g(env.context);
        g.setInput(rows.data(), rows.size());
        g.setOutput(all.data(), all.size());
        g.setTag(2);
        gloo::allgather(g);
        if (env.rank != 0) return 0;

        auto at = [&](int r, int op, int f) {
          return all[(static_cast<size_t>(r) * iters + op) * kFields + f];
        };
        std::vector<double> us;
        std::vector<std::vector<double>> sum(iters, std::vector<double>(kFields, 0.0));
        for (int op = 0; op < iters; ++op) {
          us.push_back(at(0, op, kUs));
          for (int r = 0; r < ranks; ++r) {
            for (int f = 1; f < kFields; ++f) sum[op][f] += at(r, op, f);
          }
          sum[op][kUs] = at(0, op, kUs);
        }
        const double p50 = Percentile(us, 0.5), p99 = Percentile(us, 0.99);
        std::printf("ranks %d, %zu B, %d iterations: p50 %.1f ms, p99 %.1f ms, max %.1f ms, "
                    "p99/p50 %.2f\n",
                    ranks, elements * sizeof(float), iters, p50 / 1e3, p99 / 1e3,
                    *std::max_element(us.begin(), us.end()) / 1e3, p99 / p50);
        std::vector<double> total(kFields, 0.0);
        for (int op = 0; op < iters; ++op) {
          for (int f = 1; f < kFields; ++f) total[f] += sum[op][f];
        }
        std::printf("totals:");
        for (int f = 1; f < kFields; ++f) std::printf(" %s %.0f", kNames[f], total[f]);
        std::printf("\nretransmitted / lost bytes: %.2f\n",
                    total[kDroppedBytes] > 0 ? total[kRetxBytes] / total[kDroppedBytes] : 0.0);
        std::vector<int> order(iters);
        for (int i = 0; i < iters; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](int x, int y) { return us[x] > us[y]; });
        std::printf("%-8s", "op");
        for (int f = 0; f < kFields; ++f) std::printf(" %10s", kNames[f]);
        std::printf("\n");
        auto print = [&](const char* label, int op) {
          std::printf("%-4s%4d", label, op);
          for (int f = 0; f < kFields; ++f) std::printf(" %10.0f", sum[op][f]);
          std::printf("\n");
        };
        for (int k = 0; k < std::min(slowest, iters); ++k) print("slow", order[k]);
        print("p50", order[iters / 2]);
        return 0;
      });
}
