// The README demo: 4 local ranks, one 16 MiB gradient bucket, a cloud-like tail — every
// iteration one rank (seeded choice) is a straggler by an exponentially distributed delay,
// and the datagram transport loses 1% of its packets (seeded). The same schedule runs for
//   Gloo ring_chunked over Gloo TCP (no injected loss: the kernel's TCP has no hook),
//   Gloo ring_chunked over optireduce's UDP transport (1% loss, reliable service),
//   TAR over the UDP transport (1% loss, reliable service),
//   OptiReduce mode over the UDP transport (1% loss, bounded service),
// and one table compares how long an allreduce call blocks (slowest rank, per iteration),
// the tail ratio p99/p50, the loss OptiReduce absorbed and the error it left.
//
//   optireduce-demo [--ranks 4] [--size 16M] [--iters 40] [--straggler-ms 15] [--loss 0.01]
//                   [--csv FILE]
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>

#include "absl/strings/numbers.h"
#include "algorithms/allreduce.h"
#include "algorithms/op_stats.h"
#include "bench/local_ranks.h"

namespace optireduce {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using RawFunc = void (*)(void*, const void*, const void*, size_t);

struct Config {
  int ranks = 4;
  size_t bytes = 16 << 20;
  int iters = 40;
  int warmup = 24;  // >= the bounded mode's 20 calibration operations
  double straggler_ms = 15;
  double loss = 0.01;
  std::string csv;
};

struct Row {
  const char* label;
  const char* algo;       // ring_chunked, transpose, optireduce
  const char* transport;  // tcp, udp
  bool inject_loss;
};

const Row kRows[] = {
    {"Gloo ring_chunked, Gloo TCP", "ring_chunked", "tcp", false},
    {"Gloo ring_chunked, our UDP", "ring_chunked", "udp", true},
    {"TAR (reliable), our UDP", "transpose", "udp", true},
    {"OptiReduce mode, our UDP", "optireduce", "udp", true},
};

struct Result {
  double p50 = 0, p99 = 0, loss_pct = 0, rel_error = 0;
  bool ok = false;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1)];
}

// One rank of one row; rank 0 writes "p50 p99 loss err" to `out`.
int RankMain(const RankEnv& env, const Config& cfg, const Row& row, const std::string& out) {
  const auto& ctx = env.context;
  const size_t count = cfg.bytes / sizeof(float);
  std::vector<float> data(count);
  auto fill = [&] {
    for (size_t i = 0; i < count; i++) data[i] = static_cast<float>(env.rank + 1 + (i % 3));
  };
  std::unique_ptr<gloo::Algorithm> ring;
  if (std::string(row.algo) == "ring_chunked") {
    ring.reset(new gloo::AllreduceRingChunked<float>(ctx, {data.data()}, static_cast<int>(count)));
  }
  OpStats stats;
  auto run_once = [&] {
    if (ring) {
      ring->run();
      return;
    }
    AllreduceOptions opts(ctx);
    opts.setOutput(data.data(), count);
    opts.setReduceFunction(RawFunc(&gloo::sum<float>));
    opts.setTag(1);
    if (std::string(row.algo) == "optireduce") {
      opts.setMode(AllreduceOptions::Mode::kBounded);
      opts.setHadamard(AllreduceOptions::Hadamard::kAuto);
      opts.setStatsOutput(&stats);
    }
    allreduce(opts);
  };
  gloo::BarrierOptions barrier(ctx);
  barrier.setTag(7);
  // Warm-up without stragglers: it also calibrates the bounded mode's time bound.
  for (int it = 0; it < cfg.warmup; it++) {
    fill();
    gloo::barrier(barrier);
    run_once();
  }
  // Every rank draws the same schedule: who straggles in each iteration, and by how much.
  std::mt19937_64 schedule(2024);
  std::exponential_distribution<double> delay_ms(1.0 / cfg.straggler_ms);
  std::vector<double> lat(cfg.iters);
  double loss = 0, err = 0;
  const int n = env.size;
  for (int it = 0; it < cfg.iters; it++) {
    const int straggler = static_cast<int>(schedule() % n);
    const double delay = std::min(delay_ms(schedule), 10 * cfg.straggler_ms);
    fill();
    gloo::barrier(barrier);
    if (env.rank == straggler) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay));
    }
    const auto start = Clock::now();
    run_once();
    lat[it] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    loss += stats.loss_pct;
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
      const double want = n * (n + 1) / 2.0 + n * static_cast<double>(i % 3);
      num += (data[i] - want) * (data[i] - want);
      den += want * want;
    }
    err += std::sqrt(num / den);
  }
  // An allreduce is done when its slowest rank returns: max over ranks per iteration.
  gloo::AllreduceOptions max_opts(ctx);
  max_opts.setOutput(lat.data(), lat.size());
  max_opts.setReduceFunction(RawFunc(&gloo::max<double>));
  max_opts.setTag(9);
  gloo::allreduce(max_opts);
  double summary[2] = {loss / cfg.iters, err / cfg.iters};
  gloo::AllreduceOptions sum_opts(ctx);
  sum_opts.setOutput(summary, 2);
  sum_opts.setReduceFunction(RawFunc(&gloo::sum<double>));
  sum_opts.setTag(10);
  gloo::allreduce(sum_opts);
  if (env.rank != 0) return 0;
  FILE* f = std::fopen(out.c_str(), "w");
  if (f == nullptr) return 1;
  std::fprintf(f, "%.4f %.4f %.6f %.8f\n", Percentile(lat, 0.5), Percentile(lat, 0.99),
               summary[0] / n, summary[1] / n);
  std::fclose(f);
  return 0;
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: optireduce-demo [--ranks N (2..8)] [--size BYTES[K|M]] "
               "[--iters N] [--straggler-ms MEAN] [--loss FRACTION] [--csv FILE]\n",
               why.c_str());
  return 2;
}

}  // namespace
}  // namespace bench
}  // namespace optireduce

int main(int argc, char** argv) {
  using namespace optireduce::bench;
  Config cfg;
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    auto number = [&](double* out, double lo, double hi) {
      return absl::SimpleAtod(value, out) && *out >= lo && *out <= hi;
    };
    double v = 0;
    if (arg == "--ranks") {
      if (!number(&v, 2, 8)) return Usage("--ranks takes a number from 2 to 8, got '" + value + "'");
      cfg.ranks = static_cast<int>(v);
    } else if (arg == "--size") {
      std::string digits = value;
      size_t mult = 1;
      if (!digits.empty() && (digits.back() == 'M' || digits.back() == 'K')) {
        mult = digits.back() == 'M' ? 1 << 20 : 1 << 10;
        digits.pop_back();
      }
      if (!absl::SimpleAtod(digits, &v) || v * mult < 1024 || v * mult > (1u << 30))
        return Usage("--size takes 1K..1024M, got '" + value + "'");
      cfg.bytes = static_cast<size_t>(v * mult) / 4 * 4;
    } else if (arg == "--iters") {
      if (!number(&v, 5, 100000)) return Usage("--iters takes a number >= 5, got '" + value + "'");
      cfg.iters = static_cast<int>(v);
    } else if (arg == "--straggler-ms") {
      if (!number(&v, 0.001, 10000)) return Usage("--straggler-ms takes a positive mean in ms");
      cfg.straggler_ms = v;
    } else if (arg == "--loss") {
      if (!number(&v, 0, 0.5)) return Usage("--loss takes a fraction from 0 to 0.5");
      cfg.loss = v;
    } else if (arg == "--csv") {
      if (value.empty()) return Usage("--csv needs a file name");
      cfg.csv = value;
    } else {
      return Usage("unknown argument '" + arg + "'");
    }
    i++;
  }
  char tmpl[] = "/tmp/optireduce-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::printf("optireduce demo: %d local ranks, %zu MiB float32 sum per allreduce, %d iterations\n"
              "tail: one straggler per iteration (delay ~ Exp(mean %.0f ms)), %.1f%% packet loss "
              "on our UDP transport\n\n",
              cfg.ranks, cfg.bytes >> 20, cfg.iters, cfg.straggler_ms, 100 * cfg.loss);
  std::fflush(stdout);
  Result results[4];
  int rc = 0;
  for (int r = 0; r < 4; r++) {
    const Row& row = kRows[r];
    std::fprintf(stderr, "running %s...\n", row.label);
    char faults[128] = "";
    if (row.inject_loss && cfg.loss > 0) {
      std::snprintf(faults, sizeof(faults), "drop=%g,seed=%d", cfg.loss, 17 + r);
    }
    setenv("OPTIREDUCE_FAULTS", faults, 1);
    const std::string out = std::string(tmpl) + "/row" + std::to_string(r);
    const int status = RunLocalRanks(cfg.ranks, row.transport, 900, [&](const RankEnv& env) {
      return RankMain(env, cfg, row, out);
    });
    unsetenv("OPTIREDUCE_FAULTS");
    FILE* f = std::fopen(out.c_str(), "r");
    Result& res = results[r];
    res.ok = status == 0 && f != nullptr &&
             std::fscanf(f, "%lf %lf %lf %lf", &res.p50, &res.p99, &res.loss_pct, &res.rel_error) == 4;
    if (f) std::fclose(f);
    std::remove(out.c_str());
    if (!res.ok) rc = 1;
  }
  rmdir(tmpl);
  const double base_p99 = results[0].ok ? results[0].p99 : 0;
  std::printf("%-29s %9s %9s %8s %10s %8s %10s\n", "allreduce", "p50 ms", "p99 ms", "p99/p50",
              "p99 vs 1st", "loss %", "rel.error");
  FILE* csv = cfg.csv.empty() ? nullptr : std::fopen(cfg.csv.c_str(), "w");
  if (csv) std::fprintf(csv, "row,p50_ms,p99_ms,p99_over_p50,loss_pct,rel_error\n");
  for (int r = 0; r < 4; r++) {
    const Result& res = results[r];
    if (!res.ok) {
      std::printf("%-29s %9s\n", kRows[r].label, "FAILED");
      continue;
    }
    std::printf("%-29s %9.1f %9.1f %8.2f %9.2fx %8.3f %10.2e\n", kRows[r].label, res.p50, res.p99,
                res.p99 / res.p50, base_p99 > 0 ? res.p99 / base_p99 : 0.0, res.loss_pct,
                res.rel_error);
    if (csv) {
      std::fprintf(csv, "%s,%.3f,%.3f,%.3f,%.4f,%.3e\n", kRows[r].label, res.p50, res.p99,
                   res.p99 / res.p50, res.loss_pct, res.rel_error);
    }
  }
  if (csv) std::fclose(csv);
  std::printf("\np50/p99: how long one allreduce call blocks (slowest rank). Reliable algorithms "
              "wait for the straggler and for retransmissions; OptiReduce mode stops at its "
              "calibrated time bound and compensates what is missing (loss %%, rel.error: relative "
              "L2 error of the result; 0 for exact algorithms).\n");
  return rc;
}
