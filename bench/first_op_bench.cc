// first_op_bench: what the first exact TAR operation of a process costs — resident memory
// it adds and its time, next to the second operation's time. Each (ranks, size) row runs
// in fresh local processes (RunLocalRanks), so the first operation is really the first:
// per-thread scratch, the transport's buffers and every page they touch are new.
// TAR is forced with the Hadamard transform, as OPTIREDUCE_HADAMARD=1 does through torch
// (and as OptiReduce mode's calibrating operations run it).
//
//   first_op_bench [--ranks 4,16] [--sizes 4,64K,16M] [--transport udp]
//                  [--segment-bytes N] [--csv FILE]
//
// Columns: rss_mib is the largest growth of one rank's resident memory over the first
// operation, first_ms / second_ms the slowest rank's time of the first / second operation.
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "algorithms/allreduce.h"
#include "bench/local_ranks.h"

namespace optireduce {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using RawFunc = void (*)(void*, const void*, const void*, size_t);

struct Config {
  std::vector<int> ranks = {4, 16};
  std::vector<size_t> sizes = {4, 64 << 10, 16 << 20};
  std::string transport = "udp";
  size_t segment_bytes = 0;  // 0: the library's default
  std::string csv;
};

double ResidentMiB() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20) : 0;
}

// A size with an optional K/M suffix (binary).
bool ParseSize(const std::string& s, size_t* out) {
  std::string digits = s;
  size_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1 << 10;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1 << 20;
  if (mult != 1) digits.pop_back();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v)) return false;
  *out = v * mult;
  return true;
}

bool ParseArgs(int argc, char** argv, Config* cfg) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) {
      std::fprintf(stderr, "first_op_bench: %s needs a value\n", a.c_str());
      return false;
    }
    i++;
    if (a == "--ranks") {
      cfg->ranks.clear();
      for (const auto& part : absl::StrSplit(v, ',')) {
        int r = 0;
        if (!absl::SimpleAtoi(part, &r) || r < 2) {
          std::fprintf(stderr, "first_op_bench: bad rank count '%s'\n", std::string(part).c_str());
          return false;
        }
        cfg->ranks.push_back(r);
      }
    } else if (a == "--sizes") {
      cfg->sizes.clear();
      for (const auto& part : absl::StrSplit(v, ',')) {
        size_t b = 0;
        if (!ParseSize(std::string(part), &b) || b < 4 || b % 4 != 0) {
          std::fprintf(stderr, "first_op_bench: bad size '%s' (bytes, a multiple of 4)\n",
                       std::string(part).c_str());
          return false;
        }
        cfg->sizes.push_back(b);
      }
    } else if (a == "--transport") {
      cfg->transport = v;
    } else if (a == "--segment-bytes") {
      if (!ParseSize(v, &cfg->segment_bytes) || cfg->segment_bytes == 0) {
        std::fprintf(stderr, "first_op_bench: bad --segment-bytes '%s'\n", v);
        return false;
      }
    } else if (a == "--csv") {
      cfg->csv = v;
    } else {
      std::fprintf(stderr, "first_op_bench: unknown flag %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

// One timed TAR of `data`; returns milliseconds.
double TimedTar(const RankEnv& env, const Config& cfg, std::vector<float>* data) {
  AllreduceOptions opts(env.context);
  opts.setOutput(data->data(), data->size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setHadamard(AllreduceOptions::Hadamard::kOn);
  if (cfg.segment_bytes > 0) opts.setMaxSegmentBytes(cfg.segment_bytes);
  const auto t0 = Clock::now();
  allreduce(opts);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int RankMain(const RankEnv& env, const Config& cfg, size_t bytes, FILE* csv) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  // Faulted in before the measurement: the caller's buffer is not the operation's cost.
  std::memset(data.data(), 0, bytes);
  std::fill(data.begin(), data.end(), 1.0f);
  const double rss0 = ResidentMiB();
  const double first = TimedTar(env, cfg, &data);
  const double rss1 = ResidentMiB();
  std::fill(data.begin(), data.end(), 1.0f);
  const double second = TimedTar(env, cfg, &data);
  // The slowest rank's times and the largest growth.
  std::vector<double> row = {rss1 - rss0, first, second};
  gloo::AllreduceOptions max(env.context);
  max.setOutput(row.data(), row.size());
  max.setReduceFunction(RawFunc(&gloo::max<double>));
  gloo::allreduce(max);
  if (env.rank == 0) {
    std::printf("%-9s %5d %10zu %9.1f %10.2f %10.2f\n", cfg.transport.c_str(), env.size, bytes,
                row[0], row[1], row[2]);
    std::fflush(stdout);
    if (csv != nullptr) {
      std::fprintf(csv, "%s,%d,%zu,%.2f,%.3f,%.3f\n", cfg.transport.c_str(), env.size, bytes,
                   row[0], row[1], row[2]);
      std::fflush(csv);
    }
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace optireduce

int main(int argc, char** argv) {
  using namespace optireduce::bench;
  Config cfg;
  if (!ParseArgs(argc, argv, &cfg)) return 2;
  FILE* csv = nullptr;
  if (!cfg.csv.empty()) {
    csv = std::fopen(cfg.csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "first_op_bench: cannot write %s: %s\n", cfg.csv.c_str(),
                   std::strerror(errno));
      return 2;
    }
    std::fprintf(csv, "transport,ranks,bytes,rss_mib,first_ms,second_ms\n");
    std::fflush(csv);
  }
  std::printf("%-9s %5s %10s %9s %10s %10s\n", "transport", "ranks", "bytes", "rss_mib",
              "first_ms", "second_ms");
  std::fflush(stdout);
  int rc = 0;
  for (const int ranks : cfg.ranks) {
    for (const size_t bytes : cfg.sizes) {
      const int status = RunLocalRanks(ranks, cfg.transport, 600, [&](const RankEnv& env) {
        return RankMain(env, cfg, bytes, csv);
      });
      if (status != 0) {
        std::fprintf(stderr, "first_op_bench: %d ranks, %zu bytes failed (status %d)\n", ranks,
                     bytes, status);
        rc = 1;
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return rc;
}
