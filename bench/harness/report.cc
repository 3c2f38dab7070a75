#include "bench/harness/report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <numeric>

namespace optireduce {
namespace bench {
namespace {

constexpr int kWidth = 11 * 6 + 19 + 13 + 10 + 11 + 12;

std::string Line() { return std::string(kWidth, '='); }

void Centered(const std::string& s) {
  const int pad = std::max(0, (kWidth - static_cast<int>(s.size())) / 2);
  std::printf("%*s%s\n\n", pad, "", s.c_str());
}

struct Summary {
  int64_t min = 0, p50 = 0, p99 = 0, max = 0;
  double gbps = 0, loss_pct = 0;
  std::string timeouts = "-";
};

Summary Summarize(const SizeResult& r) {
  Summary s;
  std::vector<int64_t> v = r.nanos;
  std::sort(v.begin(), v.end());
  if (v.empty()) return s;
  s.min = v.front();
  s.max = v.back();
  s.p50 = Percentile(v, 0.50);
  s.p99 = Percentile(v, 0.99);
  // Gloo's bandwidth: bytes per buffer times samples over the summed time (per thread),
  // in GiB/s.
  const double total_secs = std::accumulate(v.begin(), v.end(), 0.0) / r.threads / 1e9;
  s.gbps = total_secs > 0 ? double(r.bytes) * v.size() / total_secs / (1024.0 * 1024 * 1024) : 0;
  double loss = 0;
  std::map<std::string, int> counts;
  for (const IterationStats& st : r.stats) {
    loss += st.loss_fraction;
    if (st.phase_timeouts != "-") counts[st.phase_timeouts]++;
  }
  s.loss_pct = r.stats.empty() ? 0 : 100.0 * loss / r.stats.size();
  // The most frequent combination, with its share when not every iteration had it.
  int best = 0;
  for (const auto& [k, n] : counts) {
    if (n > best) {
      best = n;
      s.timeouts = k;
    }
  }
  if (best > 0 && best < static_cast<int>(r.stats.size())) {
    s.timeouts += "(" + std::to_string(100 * best / static_cast<int>(r.stats.size())) + "%)";
  }
  return s;
}

}  // namespace

int64_t Percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t idx = static_cast<size_t>(p * sorted.size());
  return sorted[std::min(idx, sorted.size() - 1)];
}

void PrintHeader(const BenchOptions& o, const std::string& device) {
  std::string algo = o.benchmark;
  for (auto& c : algo) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::printf("%s\n", Line().c_str());
  Centered(algo);
  std::printf("%-13s%s\n", "Device:", device.c_str());
  std::printf("%-13sprocesses=%d, inputs=%d, threads=%d", "Options:", o.size, o.inputs, o.threads);
  if (o.benchmark == "allreduce_bcube") std::printf(", base=%d", o.base);
  std::printf(", verify=%s", o.verify ? "true" : "false");
  if (!o.straggler_dist.empty()) {
    std::printf(", straggler=rank %d %s ms",
                o.straggler_rank >= 0 ? o.straggler_rank : o.size - 1, o.straggler_dist.c_str());
  }
  std::printf("\n\n%s\n", Line().c_str());
  Centered("BENCHMARK RESULTS");
  const char* unit = o.show_nanos ? "(ns)" : "(us)";
  // The last column is left-aligned after two spaces: "early/early(100%)" is 17 wide.
  std::printf("%11s%11s%11s%11s%11s%11s%19s%13s%10s%11s  %s\n", "size (B)", "elements",
              (std::string("min ") + unit).c_str(), (std::string("p50 ") + unit).c_str(),
              (std::string("p99 ") + unit).c_str(), (std::string("max ") + unit).c_str(),
              "bandwidth (GB/s)", "iterations", "loss (%)", "rel err", "timeout");
  std::fflush(stdout);
}

void PrintRow(const BenchOptions& o, const SizeResult& r) {
  const Summary s = Summarize(r);
  const int64_t div = o.show_nanos ? 1 : 1000;
  char rel[32] = "-";
  if (r.verified) std::snprintf(rel, sizeof(rel), "%.2e", r.rel_error);
  std::printf("%11zu%11zu%11lld%11lld%11lld%11lld%19.3f%13zu%10.3f%11s  %s\n", r.bytes,
              r.elements, (long long)(s.min / div), (long long)(s.p50 / div),
              (long long)(s.p99 / div), (long long)(s.max / div), s.gbps, r.nanos.size(),
              s.loss_pct, rel, s.timeouts.c_str());
  std::fflush(stdout);
}

void PrintFooter() {
  std::printf("\n%s\n", Line().c_str());
  std::fflush(stdout);
}

bool AppendCsv(const BenchOptions& o, const SizeResult& r) {
  FILE* f = std::fopen(o.csv.c_str(), "a");
  if (f == nullptr) return false;
  if (std::ftell(f) == 0) {
    std::fprintf(f,
                 "benchmark,transport,processes,inputs,threads,bytes,elements,min_us,p50_us,"
                 "p99_us,max_us,bandwidth_gbps,iterations,loss_pct,rel_error,timeouts,straggler,"
                 "rel_error_last\n");
  }
  const Summary s = Summarize(r);
  std::fprintf(f, "%s,%s,%d,%d,%d,%zu,%zu,%.3f,%.3f,%.3f,%.3f,%.4f,%zu,%.4f,%s,%s,%s,%s\n",
               o.benchmark.c_str(), o.transport.c_str(), o.size, o.inputs, o.threads, r.bytes,
               r.elements, s.min / 1e3, s.p50 / 1e3, s.p99 / 1e3, s.max / 1e3, s.gbps,
               r.nanos.size(), s.loss_pct,
               r.verified ? std::to_string(r.rel_error).c_str() : "", s.timeouts.c_str(),
               o.straggler_dist.c_str(),
               r.verified_last ? std::to_string(r.rel_error_last).c_str() : "");
  const bool ok = std::ferror(f) == 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace bench
}  // namespace optireduce
