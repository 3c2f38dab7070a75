// transport_bench: Gloo's AllreduceRingChunked over our udp device vs Gloo's
// TCP device, ranks as separate processes on this host.
//
//   transport_bench [--ranks=4] [--transports=udp,tcp] [--min=65536]
//                   [--max=67108864] [--csv=out.csv] [--faults=SPEC]
//
// Prints, per transport and size: p50/p99 latency of one allreduce, bus
// bandwidth (2(n-1)/n * bytes / p50), CPU seconds of all ranks per GiB
// reduced (getrusage of the rank processes), and the idle CPU of one device.
// Environment (bench/README.md): BENCH_SPIN_US, BENCH_DATAGRAM, BENCH_TIMEOUT_S.
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gloo_ext/devices.h"
#include "transport_dpdk/device.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Row {
  std::string transport;
  size_t bytes = 0;
  int iters = 0;
  double p50_ms = 0, p99_ms = 0, busbw_gbps = 0, cpu_s_per_gib = 0;
  bool verified = false;
};

double CpuSeconds(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

std::shared_ptr<gloo::transport::Device> MakeDevice(const std::string& t,
                                                    const std::string& faults) {
  if (t == "tcp") {
    gloo::transport::tcp::attr a;
    a.hostname = "127.0.0.1";
    return gloo::transport::tcp::CreateDevice(a);
  }
  optireduce::transport::udp::attr a;
  // The library's engine variables (OPTIREDUCE_FAULTS, ...) apply; --faults overrides.
  auto engine = optireduce::gloo_ext::EngineOptionsFromEnvironment();
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    std::exit(2);
  }
  if (!faults.empty()) engine->faults = faults;
  if (const char* v = getenv("BENCH_SPIN_US")) engine->spin = std::chrono::microseconds(atoi(v));
  if (const char* v = getenv("BENCH_DATAGRAM")) a.max_datagram = atoi(v);
  return optireduce::transport::udp::CreateDevice(a, *engine);
}

int Iterations(size_t bytes) {
  if (bytes <= (256 << 10)) return 200;
  if (bytes <= (4 << 20)) return 50;
  if (bytes <= (16 << 20)) return 12;
  return 5;
}

// One rank: for each size, verify once then time `iters` allreduces.
// Writes "bytes iters cpu_seconds verified lat_ms..." lines to out.
int RunRank(const std::string& transport, const std::string& faults, int rank,
            int size, const std::string& store_dir, const std::vector<size_t>& sizes,
            const std::string& out) {
  auto dev = MakeDevice(transport, faults);
  gloo::rendezvous::FileStore store(store_dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(getenv("BENCH_TIMEOUT_S") ? atoi(getenv("BENCH_TIMEOUT_S")) : 120));
  ctx->connectFullMesh(store, dev);
  std::ofstream f(out);
  for (size_t bytes : sizes) {
    const size_t n = bytes / sizeof(uint32_t);
    std::vector<uint32_t> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint32_t>((rank + 1) * (i % 1009));
    std::vector<uint32_t*> ptrs{data.data()};
    gloo::AllreduceRingChunked<uint32_t> algo(ctx, ptrs, static_cast<int>(n));
    algo.run();
    bool ok = true;
    const uint32_t tri = static_cast<uint32_t>(size * (size + 1) / 2);
    for (size_t i = 0; i < n && ok; ++i) ok = data[i] == tri * (i % 1009);
    const int iters = Iterations(bytes);
    algo.run();  // warm-up
    std::vector<double> lat;
    const double cpu0 = CpuSeconds(RUSAGE_SELF);
    for (int it = 0; it < iters; ++it) {
      const auto t0 = Clock::now();
      algo.run();
      lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    const double cpu = CpuSeconds(RUSAGE_SELF) - cpu0;
    f << bytes << " " << iters << " " << cpu << " " << ok;
    for (double l : lat) f << " " << l;
    f << "\n";
  }
  return 0;
}

double IdleDeviceCpu(const std::string& transport) {
  pid_t pid = fork();
  if (pid == 0) {
    auto dev = MakeDevice(transport, "");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double c0 = CpuSeconds(RUSAGE_SELF);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const double c1 = CpuSeconds(RUSAGE_SELF);
    _exit(std::min(255, static_cast<int>((c1 - c0) * 1000)));  // per-mille
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) / 10.0 : -1;  // percent
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"ranks", "4"},      {"transports", "udp,tcp"},
                                          {"min", "65536"},    {"max", "67108864"},
                                          {"csv", ""},         {"faults", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (s.rfind("--", 0) != 0 || eq == std::string::npos || !a.count(s.substr(2, eq - 2))) {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
    a[s.substr(2, eq - 2)] = s.substr(eq + 1);
  }
  const int ranks = std::stoi(a["ranks"]);
  std::vector<size_t> sizes;
  for (size_t b = std::stoul(a["min"]); b <= std::stoul(a["max"]); b *= 4) sizes.push_back(b);
  std::vector<std::string> transports;
  {
    std::stringstream ss(a["transports"]);
    std::string t;
    while (std::getline(ss, t, ',')) transports.push_back(t);
  }
  char tmpl[] = "/tmp/optireduce_bench_XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  const std::string dir = tmpl;
  std::vector<Row> rows;
  int failures = 0;
  for (const auto& t : transports) {
    const std::string store = dir + "/store_" + t;
    fs::create_directories(store);
    std::vector<pid_t> pids;
    for (int r = 0; r < ranks; ++r) {
      pid_t pid = fork();
      if (pid == 0) {
        int rc = 1;
        try {
          rc = RunRank(t, a["faults"], r, ranks, store, sizes,
                       dir + "/" + t + "." + std::to_string(r));
        } catch (const std::exception& e) {
          fprintf(stderr, "%s rank %d: %s\n", t.c_str(), r, e.what());
        }
        _exit(rc);
      }
      pids.push_back(pid);
    }
    for (pid_t p : pids) {
      int st = 0;
      waitpid(p, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failures;
    }
    // Aggregate: latency from rank 0, CPU summed over ranks.
    std::vector<std::vector<std::string>> lines(ranks);
    for (int r = 0; r < ranks; ++r) {
      std::ifstream f(dir + "/" + t + "." + std::to_string(r));
      std::string line;
      while (std::getline(f, line)) lines[r].push_back(line);
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      Row row;
      row.transport = t;
      row.bytes = sizes[k];
      double cpu = 0;
      bool ok = true;
      std::vector<double> lat;
      for (int r = 0; r < ranks; ++r) {
        if (k >= lines[r].size()) { ok = false; continue; }
        std::stringstream ss(lines[r][k]);
        size_t bytes;
        int iters, v;
        double c;
        ss >> bytes >> iters >> c >> v;
        row.iters = iters;
        cpu += c;
        ok = ok && v;
        if (r == 0) {
          double l;
          while (ss >> l) lat.push_back(l);
        }
      }
      if (lat.empty()) continue;
      std::sort(lat.begin(), lat.end());
      row.p50_ms = lat[lat.size() / 2];
      row.p99_ms = lat[std::min(lat.size() - 1, static_cast<size_t>(lat.size() * 0.99))];
      row.busbw_gbps = 2.0 * (ranks - 1) / ranks * row.bytes / (row.p50_ms * 1e-3) * 8 / 1e9;
      row.cpu_s_per_gib = cpu / (static_cast<double>(row.bytes) * row.iters / (1 << 30));
      row.verified = ok;
      rows.push_back(row);
    }
  }
  printf("AllreduceRingChunked<uint32>, %d ranks as processes on one host%s\n", ranks,
         a["faults"].empty() ? "" : (", udp faults " + a["faults"]).c_str());
  printf("%-5s %10s %6s %10s %10s %12s %14s %8s\n", "xport", "bytes", "iters", "p50 ms",
         "p99 ms", "busbw Gb/s", "CPU s/GiB", "exact");
  for (const Row& r : rows) {
    printf("%-5s %10zu %6d %10.3f %10.3f %12.2f %14.2f %8s\n", r.transport.c_str(), r.bytes,
           r.iters, r.p50_ms, r.p99_ms, r.busbw_gbps, r.cpu_s_per_gib, r.verified ? "yes" : "NO");
  }
  for (const auto& t : transports) {
    printf("idle CPU of one %s device: %.1f%% of a core\n", t.c_str(), IdleDeviceCpu(t));
  }
  if (!a["csv"].empty()) {
    std::ofstream csv(a["csv"]);
    csv << "transport,bytes,iters,p50_ms,p99_ms,busbw_gbps,cpu_s_per_gib,exact\n";
    for (const Row& r : rows) {
      csv << r.transport << "," << r.bytes << "," << r.iters << "," << r.p50_ms << ","
          << r.p99_ms << "," << r.busbw_gbps << "," << r.cpu_s_per_gib << ","
          << (r.verified ? 1 : 0) << "\n";
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (failures) fprintf(stderr, "%d rank process(es) failed\n", failures);
  return failures ? 1 : 0;
}
