// Compares allreduce algorithms on N local ranks (processes) and prints one table:
// p50/p99 latency and bus bandwidth per algorithm and size, and each algorithm's p50 as a
// ratio to Gloo's ring_chunked measured in the same run. Every result is verified.
//
//   optireduce-sweep [--ranks 4] [--transport tcp] [--sizes 4K,64K,1M,16M,64M]
//                   [--iters N] [--algos a[@transport],b,...] [--csv FILE]
//                   [--tar-chunk SIZE]
//
// An algorithm may name its own transport, e.g. TAR over the DPDK backend (a memif mesh
// between the local ranks) against Gloo's ring_chunked over Gloo's TCP device:
//   optireduce-sweep --sizes 1M,4M,16M,64M --algos ring_chunked@tcp,transpose@dpdk
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "algorithms/allreduce.h"
#include "bench/local_ranks.h"

namespace optireduce {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using RawFunc = void (*)(void*, const void*, const void*, size_t);

// transpose: optireduce::allreduce as users get it (recursive doubling below its small-message
// cut-over); transpose_tar: TAR at every size; recursive_doubling: recursive doubling at every
// size (the last two choose the cut-over).
const std::vector<std::string> kAllAlgos = {"ring_chunked", "halving_doubling", "gloo_allreduce",
                                            "transpose", "transpose_hadamard", "transpose_tar",
                                            "recursive_doubling"};

// One measured entry: an algorithm on a transport ("transpose@dpdk"; no "@": --transport).
struct Entry {
  std::string algo;
  std::string transport;
  std::string label;  // what the table shows: algo, or algo@transport when it named one
};

struct Config {
  int ranks = 4;
  std::string transport = "tcp";
  std::vector<size_t> sizes = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  int iters = 0;  // 0: chosen per size
  std::vector<Entry> entries;
  std::string csv;
  // Exact TAR's pipeline chunk (AllreduceOptions::setPipelineChunkBytes; 0: none).
  size_t tar_chunk = optireduce::AllreduceOptions::kDefaultPipelineChunkBytes;
  // Runs of every algorithm, interleaved (all algorithms once, then again); the table
  // reports the median run.
  int repeat = 1;
};

bool ParseSize(const std::string& text, size_t* out) {
  if (text.empty()) return false;
  size_t mult = 1;
  std::string digits = text;
  const char unit = static_cast<char>(std::toupper(text.back()));
  if (unit == 'K' || unit == 'M' || unit == 'G') {
    mult = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : size_t{1} << 30;
    digits.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v)) return false;
  *out = v * mult;
  return true;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "error: %s\nusage: optireduce-sweep [--ranks N (2..16)] [--transport tcp] "
               "[--sizes 4K,64K,1M,...] [--iters N] [--algos A[@TRANSPORT],...] [--csv FILE] "
               "[--tar-chunk SIZE (0: no pipelining)] [--repeat N (1..20)]\n"
               "algorithms: %s\ntransports: %s\n",
               why,
               "ring_chunked,halving_doubling,gloo_allreduce,transpose,transpose_hadamard,"
               "transpose_tar,recursive_doubling",
               AvailableTransports().c_str());
  return 2;
}

// One rank's timed loop for one algorithm at one size. Returns per-iteration latencies
// (microseconds) measured on this rank, each iteration started together after a barrier
// and ended by one: a rank that is done refills its input only once every rank is, so
// that the harness's own work never overlaps another rank's timed allreduce (ranks share
// the host's cores).
std::vector<double> RunAlgo(const RankEnv& env, const std::string& algo, size_t count,
                            int iters, size_t tar_chunk, bool* verified) {
  const auto& ctx = env.context;
  std::vector<float> input(count);
  for (size_t i = 0; i < count; i++) input[i] = static_cast<float>(env.rank + 1 + (i % 3));
  std::vector<float> data = input;
  auto fill = [&] { std::copy(input.begin(), input.end(), data.begin()); };
  std::unique_ptr<gloo::Algorithm> old_style;
  float* ptr = data.data();
  if (algo == "ring_chunked") {
    old_style.reset(new gloo::AllreduceRingChunked<float>(ctx, {ptr}, static_cast<int>(count)));
  } else if (algo == "halving_doubling") {
    old_style.reset(
        new gloo::AllreduceHalvingDoubling<float>(ctx, {ptr}, static_cast<int>(count)));
  }
  auto run_once = [&](uint32_t tag) {
    if (old_style) {
      old_style->run();
    } else if (algo == "gloo_allreduce") {
      gloo::AllreduceOptions opts(ctx);
      opts.setOutput(ptr, count);
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setTag(tag);
      gloo::allreduce(opts);
    } else {
      optireduce::AllreduceOptions opts(ctx);
      opts.setOutput(ptr, count);
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setTag(tag);
      opts.setHadamard(algo == "transpose_hadamard" ? AllreduceOptions::Hadamard::kOn
                                                    : AllreduceOptions::Hadamard::kOff);
      opts.setPipelineChunkBytes(tar_chunk);
      if (algo == "transpose_tar") opts.setSmallMessageBytes(0);
      if (algo == "recursive_doubling") opts.setSmallMessageBytes(SIZE_MAX);
      optireduce::allreduce(opts);
    }
  };
  // Warm-up and verification: every element is sum over ranks of (rank + 1 + i % 3).
  run_once(1);
  const int n = env.size;
  *verified = true;
  for (size_t i = 0; i < count; i++) {
    const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 3));
    if (std::fabs(data[i] - want) > 1e-3f * want) {
      *verified = false;
      break;
    }
  }
  std::vector<double> lat;
  for (int it = 0; it < iters; it++) {
    fill();
    gloo::BarrierOptions barrier(ctx);
    barrier.setTag(7);
    gloo::barrier(barrier);
    const auto start = Clock::now();
    run_once(1);
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    gloo::barrier(barrier);
  }
  return lat;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t idx = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[idx];
}

std::string HumanSize(size_t bytes) {
  char buf[32];
  if (bytes >= (1 << 20)) std::snprintf(buf, sizeof(buf), "%zu MiB", bytes >> 20);
  else if (bytes >= (1 << 10)) std::snprintf(buf, sizeof(buf), "%zu KiB", bytes >> 10);
  else std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  return buf;
}

struct Row {
  size_t bytes;
  std::string algo;
  double p50, p99, busbw;
  bool ok;
};

// Measures one algorithm at every size; rank 0 appends rows to `results`.
int RankMain(const RankEnv& env, const Config& cfg, const std::string& algo,
             const std::string& label, const std::string& results) {
  int status = 0;
  for (size_t bytes : cfg.sizes) {
    const size_t count = std::max<size_t>(1, bytes / sizeof(float));
    const int iters = cfg.iters > 0 ? cfg.iters
                                    : static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 8, 200));
    bool verified = false;
    std::vector<double> lat = RunAlgo(env, algo, count, iters, cfg.tar_chunk, &verified);
    // An allreduce is done when the last rank has its result: per iteration, the slowest rank.
    gloo::AllreduceOptions opts(env.context);
    opts.setOutput(lat.data(), lat.size());
    opts.setReduceFunction(RawFunc(&gloo::max<double>));
    opts.setTag(9);
    gloo::allreduce(opts);
    int ok = verified ? 1 : 0;
    gloo::AllreduceOptions vopts(env.context);
    vopts.setOutput(&ok, 1);
    vopts.setReduceFunction(RawFunc(&gloo::min<int>));
    vopts.setTag(10);
    gloo::allreduce(vopts);
    if (!ok) status = 3;
    if (env.rank != 0) continue;
    const double p50 = Percentile(lat, 0.50), p99 = Percentile(lat, 0.99);
    const double busbw =
        2.0 * (env.size - 1) / env.size * static_cast<double>(count * 4) / (p50 * 1e-6) / 1e9;
    FILE* f = std::fopen(results.c_str(), "a");
    if (f == nullptr) return 1;
    std::fprintf(f, "%zu %s %.3f %.3f %.6f %d\n", bytes, label.c_str(), p50, p99, busbw, ok);
    std::fclose(f);
  }
  return status;
}

std::vector<Row> ReadRows(const std::string& path) {
  std::vector<Row> rows;
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return rows;
  char algo[64];
  Row r;
  int ok = 0;
  while (std::fscanf(f, "%zu %63s %lf %lf %lf %d", &r.bytes, algo, &r.p50, &r.p99, &r.busbw, &ok) == 6) {
    r.algo = algo;
    r.ok = ok != 0;
    rows.push_back(r);
  }
  std::fclose(f);
  return rows;
}

// One row per size and algorithm: of its runs, the one with the median p50 (the lower
// median for an even count) with the median of their p99s; exact only if every run was.
// A size and algorithm with fewer than `runs` rows (a run failed) has no row.
std::vector<Row> MedianRuns(const std::vector<Row>& rows, int runs) {
  std::map<std::pair<size_t, std::string>, std::vector<Row>> by_key;
  for (const Row& r : rows) by_key[{r.bytes, r.algo}].push_back(r);
  std::vector<Row> out;
  for (auto& [key, group] : by_key) {
    if (static_cast<int>(group.size()) < runs) continue;
    std::vector<double> p99;
    bool ok = true;
    for (const Row& r : group) {
      p99.push_back(r.p99);
      ok = ok && r.ok;
    }
    std::sort(group.begin(), group.end(), [](const Row& a, const Row& b) { return a.p50 < b.p50; });
    std::sort(p99.begin(), p99.end());
    Row m = group[(group.size() - 1) / 2];
    m.p99 = p99[(p99.size() - 1) / 2];
    m.ok = ok;
    out.push_back(m);
  }
  return out;
}

// Prints the comparison; returns false if any result was wrong or missing.
bool PrintTable(const Config& cfg, const std::vector<Row>& rows) {
  std::string baseline;  // the first ring_chunked entry
  for (const Entry& e : cfg.entries) {
    if (e.algo == "ring_chunked" && baseline.empty()) baseline = e.label;
  }
  std::printf("\noptireduce allreduce comparison: %d ranks (local processes), transport %s, float32 sum\n",
              cfg.ranks, cfg.transport.c_str());
  if (cfg.repeat > 1) {
    std::printf("each row: the median of %d interleaved runs (p50: the run with the median p50; "
                "p99: the median of the runs' p99s)\n",
                cfg.repeat);
  }
  std::printf("ratio = p50 time / %s's p50 time in this run (below 1 is faster); "
              "busbw x = its inverse (bus bandwidth relative to %s)\n\n",
              baseline.empty() ? "ring_chunked" : baseline.c_str(),
              baseline.empty() ? "ring_chunked" : baseline.c_str());
  std::printf("%-9s %-24s %11s %11s %10s %7s %7s %s\n", "size", "algorithm", "p50 (us)",
              "p99 (us)", "busbw GB/s", "ratio", "busbw x", "check");
  FILE* csv = cfg.csv.empty() ? nullptr : std::fopen(cfg.csv.c_str(), "w");
  if (csv) {
    std::fprintf(csv, "transport,ranks,bytes,algorithm,p50_us,p99_us,busbw_gbps,ratio_vs_ring_chunked,verified,busbw_speedup_vs_ring_chunked,runs\n");
  }
  bool all_ok = true;
  for (size_t bytes : cfg.sizes) {
    double ring_p50 = 0;
    for (const Row& r : rows) {
      if (r.bytes == bytes && r.algo == baseline) ring_p50 = r.p50;
    }
    for (const Entry& e : cfg.entries) {
      const std::string& algo = e.label;
      const Row* row = nullptr;
      for (const Row& r : rows) {
        if (r.bytes == bytes && r.algo == algo) row = &r;
      }
      if (row == nullptr) {
        std::printf("%-9s %-24s %11s %11s %10s %7s %7s %s\n", HumanSize(bytes).c_str(),
                    algo.c_str(), "-", "-", "-", "-", "-", "FAILED");
        all_ok = false;
        continue;
      }
      char ratio[16] = "-", speedup[16] = "-";
      if (ring_p50 > 0 && row->p50 > 0) {
        std::snprintf(ratio, sizeof(ratio), "%.2f", row->p50 / ring_p50);
        std::snprintf(speedup, sizeof(speedup), "%.2f", ring_p50 / row->p50);
      }
      std::printf("%-9s %-24s %11.1f %11.1f %10.3f %7s %7s %s\n", HumanSize(bytes).c_str(),
                  algo.c_str(), row->p50, row->p99, row->busbw, ratio, speedup,
                  row->ok ? "exact" : "WRONG");
      all_ok = all_ok && row->ok;
      if (csv) {
        std::fprintf(csv, "%s,%d,%zu,%s,%.1f,%.1f,%.4f,%s,%d,%s,%d\n", e.transport.c_str(),
                     cfg.ranks, bytes, e.algo.c_str(), row->p50, row->p99, row->busbw, ratio,
                     row->ok, speedup, cfg.repeat);
      }
    }
  }
  if (csv) std::fclose(csv);
  return all_ok;
}

}  // namespace
}  // namespace bench
}  // namespace optireduce

int main(int argc, char** argv) {
  using namespace optireduce::bench;
  Config cfg;
  std::string algos_text;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) return "";
      return argv[++i];
    };
    if (arg == "--ranks") {
      if (!absl::SimpleAtoi(value(), &cfg.ranks) || cfg.ranks < 2 || cfg.ranks > 16)
        return Usage("--ranks takes a number from 2 to 16");
    } else if (arg == "--transport") {
      cfg.transport = value();
      if (AvailableTransports().find(cfg.transport) == std::string::npos || cfg.transport.empty())
        return Usage(("--transport: '" + cfg.transport + "' is not available").c_str());
    } else if (arg == "--sizes") {
      cfg.sizes.clear();
      for (absl::string_view s : absl::StrSplit(value(), ',')) {
        size_t b = 0;
        if (!ParseSize(std::string(s), &b) || b < 4)
          return Usage(("--sizes: bad size '" + std::string(s) + "'").c_str());
        cfg.sizes.push_back(b);
      }
    } else if (arg == "--iters") {
      if (!absl::SimpleAtoi(value(), &cfg.iters) || cfg.iters < 1)
        return Usage("--iters takes a positive number");
    } else if (arg == "--algos") {
      algos_text = value();
      if (algos_text.empty()) return Usage("--algos needs a list");
    } else if (arg == "--tar-chunk") {
      const std::string v = value();
      if (v == "0") {
        cfg.tar_chunk = 0;
      } else if (!ParseSize(v, &cfg.tar_chunk) || cfg.tar_chunk < 4) {
        return Usage(("--tar-chunk: bad size '" + v + "' (0, or at least 4 bytes)").c_str());
      }
    } else if (arg == "--repeat") {
      if (!absl::SimpleAtoi(value(), &cfg.repeat) || cfg.repeat < 1 || cfg.repeat > 20)
        return Usage("--repeat takes a number of runs from 1 to 20");
    } else if (arg == "--csv") {
      cfg.csv = value();
      if (cfg.csv.empty()) return Usage("--csv needs a file name");
    } else {
      return Usage(("unknown argument '" + arg + "'").c_str());
    }
  }
  // Entries: "algo" (on --transport) or "algo@transport".
  std::vector<std::string> specs;
  if (algos_text.empty()) {
    specs = kAllAlgos;
  } else {
    for (absl::string_view s : absl::StrSplit(algos_text, ',')) specs.emplace_back(s);
  }
  for (const std::string& spec : specs) {
    Entry e;
    const size_t at = spec.find('@');
    e.algo = spec.substr(0, at);
    e.transport = at == std::string::npos ? cfg.transport : spec.substr(at + 1);
    e.label = spec;
    if (std::find(kAllAlgos.begin(), kAllAlgos.end(), e.algo) == kAllAlgos.end())
      return Usage(("--algos: unknown algorithm '" + e.algo + "'").c_str());
    if (e.transport == "tcp" ? false
                             : (e.transport.empty() ||
                                AvailableTransports().find(e.transport) == std::string::npos))
      return Usage(("--algos: transport '" + e.transport + "' of '" + spec +
                    "' is not available").c_str());
    cfg.entries.push_back(e);
  }
  // Each algorithm runs in its own set of processes with fresh connections: in this Gloo
  // snapshot, running an old-style (Buffer) algorithm on a TCP context slows every later
  // UnboundBuffer operation on it by ~40 ms, which would skew the comparison.
  char tmpl[] = "/tmp/optireduce-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string results = std::string(tmpl) + "/rows";
  int rc = 0;
  for (int run = 1; run <= cfg.repeat; ++run) {
    for (const Entry& e : cfg.entries) {
      std::fprintf(stderr, "running %s over %s on %d ranks (run %d of %d)...\n", e.algo.c_str(),
                   e.transport.c_str(), cfg.ranks, run, cfg.repeat);
      const int status = RunLocalRanks(cfg.ranks, e.transport, 600, [&](const RankEnv& env) {
        return optireduce::bench::RankMain(env, cfg, e.algo, e.label, results);
      });
      if (status != 0) {
        std::fprintf(stderr, "optireduce-sweep: %s failed (status %d)\n", e.label.c_str(),
                     status);
        rc = 1;
      }
    }
  }
  if (!PrintTable(cfg, MedianRuns(ReadRows(results), cfg.repeat))) rc = 1;
  std::remove(results.c_str());
  rmdir(tmpl);
  return rc;
}
