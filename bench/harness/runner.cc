#include "bench/harness/runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>

#include "absl/strings/str_cat.h"
#include "bench/harness/allreduce_bench.h"
#include "bench/harness/report.h"
#include "bench/harness/resend_counters.h"
#include "algorithms/allreduce.h"
#include "bench/harness/straggler.h"
#include "bench/harness/worker_threads.h"
#include "bench/local_ranks.h"
#include "gloo_ext/config.h"
#include "gloo_ext/redis_options.h"
#include "rendezvous/redis_store.h"

namespace optireduce {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using RawFunc = void (*)(void*, const void*, const void*, size_t);
constexpr long kMaxIterations = 1000000000;
constexpr double kItersMultiplier = 1.2;

// Gloo's sweep: 100, 200, 500, 1000, ..., 5,000,000 elements.
std::vector<size_t> ElementCounts(const BenchOptions& o) {
  if (o.elements > 0) return {static_cast<size_t>(o.elements)};
  std::vector<size_t> v;
  for (size_t i = 100; i <= 1000000; i *= 10) {
    for (size_t m : {1, 2, 5}) v.push_back(i * m);
  }
  return v;
}

// Barriers, broadcasts and reductions of the harness itself run on their own context so
// they never share pairs (or slots) with the algorithm being measured, and use only the
// new-style (UnboundBuffer) collectives.
class Control {
 public:
  Control(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  void Barrier() {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(1);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }
  long Broadcast(long value) {
    gloo::BroadcastOptions opts(ctx_);
    opts.setOutput(&value, 1);
    opts.setRoot(0);
    opts.setTag(2);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
    return value;
  }
  template <typename T>
  T Reduce(T value, RawFunc fn) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(&value, 1);
    opts.setReduceFunction(fn);
    opts.setTag(3);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
    return value;
  }
  const std::shared_ptr<gloo::Context>& context() const { return ctx_; }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
};

// The rendezvous store: Redis (--redis-host or OPTIREDUCE_REDIS_URL) or the file system.
struct Rendezvous {
  std::shared_ptr<rendezvous::RedisStore> redis;
  std::unique_ptr<gloo::rendezvous::FileStore> file;
  std::vector<std::unique_ptr<gloo::rendezvous::PrefixStore>> prefixed;
  gloo::rendezvous::Store* base = nullptr;

  explicit Rendezvous(const BenchOptions& o) {
    if (!o.redis_host.empty() ||
        (o.shared_path.empty() && gloo_ext::ReadEnvironment("OPTIREDUCE_REDIS_URL"))) {
      absl::StatusOr<rendezvous::RedisOptions> ro;
      if (!o.redis_host.empty()) {
        rendezvous::RedisOptions r;
        r.url = absl::StrCat("redis://", o.redis_password.empty() ? "" : ":",
                             o.redis_password, o.redis_password.empty() ? "" : "@",
                             o.redis_host, ":", o.redis_port);
        ro = r;
      } else {
        ro = gloo_ext::RedisOptionsFromEnvironment(o.prefix, o.size);
      }
      if (!ro.ok()) throw std::runtime_error(std::string(ro.status().message()));
      ro->job_id = o.prefix;
      ro->world_size = o.size;
      ro->timeout = o.timeout;
      auto store = rendezvous::RedisStore::Connect(*ro);
      if (!store.ok()) {
        throw std::runtime_error(absl::StrCat("redis rendezvous: ", store.status().ToString()));
      }
      redis = *store;
      base = redis.get();
    } else {
      file = std::make_unique<gloo::rendezvous::FileStore>(o.shared_path);
      base = file.get();
    }
  }

  // A full mesh over `device` whose keys live under `name`.
  std::shared_ptr<gloo::Context> Mesh(const BenchOptions& o, const std::string& name,
                                      std::shared_ptr<gloo::transport::Device> device) {
    // With Redis the job id already scopes the keys; the file store needs the prefix.
    const std::string scope = redis ? name : o.prefix + "_" + name;
    prefixed.push_back(std::make_unique<gloo::rendezvous::PrefixStore>(scope, *base));
    auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size, o.base);
    ctx->setTimeout(o.timeout);
    ctx->connectFullMesh(*prefixed.back(), device);
    return ctx;
  }

  void Finish() {
    if (redis) {
      (void)redis->Finish();
    } else if (file) {
      // As Gloo's harness: remove this rank's key files so the path can be reused.
      for (const std::string& path : file->getAllKeyFilePaths()) std::remove(path.c_str());
    }
  }
};

struct Batch {
  std::vector<int64_t> nanos;
  std::vector<IterationStats> stats;
};

class RankRunner {
 public:
  explicit RankRunner(const BenchOptions& o) : o_(o), rv_(o) {
    const bool local = o.local_child;
    std::vector<std::string> ifaces = o.tcp_devices;
    if (ifaces.empty()) ifaces.push_back("");
    for (const std::string& iface : ifaces) {
      DeviceSpec spec;
      spec.transport = o.transport;
      spec.iface = iface;
      spec.busy_poll = o.busy_poll;
      if (iface.empty() && (local || o.transport != "tcp")) spec.hostname = "127.0.0.1";
      // --local-ranks over dpdk: a memif mesh between the forked ranks, sockets in their
      // shared FileStore directory. Separate processes (--size/--rank) get their ports
      // from OPTIREDUCE_EAL_ARGS (see bench/README.md).
      if (local) UseLocalMemifMesh(&spec, o.shared_path, o.rank, o.size);
      devices_.push_back(MakeDevice(spec));
    }
    control_ = std::make_unique<Control>(rv_.Mesh(o, "ctl", devices_.front()), o.timeout);
    for (int t = 0; t < o.threads; t++) {
      contexts_.push_back(rv_.Mesh(o, "t" + std::to_string(t), devices_[t % devices_.size()]));
      if (o.sync) {
        for (int j = 0; j < o.size; j++) {
          if (j != o.rank) contexts_.back()->getPair(j)->setSync(true, o.busy_poll);
        }
      }
    }
    {
      // OptiReduce mode's process-wide policy (this process is one rank).
      TimeoutOptions timeouts;
      timeouts.repair_budget_fraction = o.repair_budget;
      timeouts.learn_start_grace = o.learn_start_grace;
      if (o.bound_cap.count() > 0) timeouts.hard_cap = o.bound_cap;
      SetDefaultTimeoutOptions(timeouts);
    }
    if (!o.straggler_dist.empty()) {
      straggler_ = std::make_unique<StragglerDist>(*StragglerDist::Parse(o.straggler_dist));
      straggler_rank_ = o.straggler_rank >= 0 ? o.straggler_rank : o.size - 1;
    }
  }

  int Run() {
    if (o_.rank == 0) PrintHeader(o_, devices_.front()->str());
    const ResendCounters start = ReadResendCounters(devices_);
    int status = 0;
    for (size_t n : ElementCounts(o_)) {
      status = RunSize(n);
      if (status != 0) break;
    }
    if (!o_.counters_csv.empty()) {
      const std::string path = o_.counters_csv + "." + std::to_string(o_.rank);
      const ResendCounters run = Delta(start, ReadResendCounters(devices_));
      if (run.source == "none") {
        std::fprintf(stderr, "optireduce-bench: --counters-csv: no counters (%s)\n",
                     run.error.c_str());
      }
      if (!WriteResendCsv(path, o_.rank, run)) {
        std::fprintf(stderr, "optireduce-bench: cannot write --counters-csv file '%s'\n",
                     path.c_str());
        status = 1;
      }
    }
    if (o_.rank == 0 && status == 0) PrintFooter();
    control_->Barrier();
    rv_.Finish();
    return status;
  }

 private:
  // Runs `iters` iterations on every thread between two barriers.
  Batch RunBatch(std::vector<std::unique_ptr<AllreduceBench>>& benches, long iters) {
    std::vector<Batch> per_thread(benches.size());
    std::vector<std::exception_ptr> errors(benches.size());
    control_->Barrier();
    if (!workers_ || workers_count_ != benches.size()) {
      workers_.reset();
      workers_ = std::make_unique<WorkerThreads>(benches.size());
      workers_count_ = benches.size();
    }
    workers_->RunOnEach([&](size_t t) {
        try {
          std::mt19937_64 rng(o_.seed * 1000003 + o_.rank * 1009 + t + draws_++);
          Batch& b = per_thread[t];
          b.nanos.reserve(std::min(iters, 1L << 20));
          b.stats.reserve(std::min(iters, 1L << 20));
          for (long i = 0; i < iters; i++) {
            benches[t]->RefillIfDue();
            if (straggler_ && o_.rank == straggler_rank_) {
              const double ms = straggler_->Draw(rng);
              std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
            }
            IterationStats st;
            const auto start = Clock::now();
            benches[t]->Run(&st);
            b.nanos.push_back(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
            b.stats.push_back(st);
          }
        } catch (...) {
          errors[t] = std::current_exception();
        }
    });
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    control_->Barrier();
    Batch all;
    for (auto& b : per_thread) {
      all.nanos.insert(all.nanos.end(), b.nanos.begin(), b.nanos.end());
      all.stats.insert(all.stats.end(), b.stats.begin(), b.stats.end());
    }
    return all;
  }

  int RunSize(size_t n) {
    const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(o_.timeout);
    std::vector<std::unique_ptr<AllreduceBench>> benches;
    for (int t = 0; t < o_.threads; t++) {
      benches.push_back(
          std::make_unique<AllreduceBench>(o_.benchmark, contexts_[t], n, o_.inputs, timeout,
                                           o_.optireduce));
    }
    SizeResult result;
    result.elements = n;
    result.bytes = n * sizeof(float);
    result.threads = o_.threads;

    // Verify the first run, as Gloo does (but with a tolerance, see AllreduceBench::Verify).
    size_t mismatches = 0;
    std::vector<std::string> errors;
    if (o_.verify) {
      Batch once = RunBatch(benches, 1);
      double rel = 0;
      for (auto& b : benches) {
        AllreduceBench::Check c = b->Verify(o_.show_all_errors ? SIZE_MAX : 20);
        mismatches += c.mismatches;
        errors.insert(errors.end(), c.errors.begin(), c.errors.end());
        rel = std::max(rel, c.rel_error);
      }
      result.rel_error = control_->Reduce<double>(rel, RawFunc(&gloo::max<double>));
      result.verified = true;
    }
    const double total_mismatches =
        control_->Reduce<double>(double(mismatches), RawFunc(&gloo::sum<double>));

    Batch warmup = RunBatch(benches, o_.warmup_iters);
    long iterations = o_.iteration_count;
    if (iterations <= 0) {
      std::sort(warmup.nanos.begin(), warmup.nanos.end());
      const long median = std::max<long>(1, Percentile(warmup.nanos, 0.5));
      // Rank 0 decides so that every rank runs the same number of iterations.
      const long nanos = control_->Broadcast(warmup.nanos.empty() ? 1000000 : median);
      iterations = std::max(1L, long(o_.iteration_time.count() / nanos));
      iterations = control_->Broadcast(std::min(iterations, kMaxIterations));
    }
    Batch timed;
    while (true) {
      timed = RunBatch(benches, iterations);
      if (o_.iteration_count > 0) break;
      long next = 0;  // 0: enough
      if (o_.rank == 0) {
        int64_t total = 0;
        for (int64_t x : timed.nanos) total += x;
        total /= o_.threads;
        if (total <= o_.iteration_time.count() && iterations < kMaxIterations) {
          next = std::max(iterations + 1, long(kItersMultiplier * iterations));
          next = std::min(next, kMaxIterations);
        }
      }
      next = control_->Broadcast(next);
      if (next == 0) break;
      iterations = next;
    }
    result.nanos = std::move(timed.nanos);
    result.stats = std::move(timed.stats);
    if (o_.verify_last) {
      // One more operation from a fresh pattern, in the state the timed ones left (a
      // bounded mode's learned bound, the same faults): its error, not its mismatches,
      // is the result — an approximate result is what OptiReduce mode may return.
      // On buffers of their own: a part the last timed operation deferred is not this
      // pattern's (AllreduceBench::UseFreshBuffers).
      for (auto& b : benches) b->UseFreshBuffers();
      RunBatch(benches, 1);
      double rel = 0;
      for (auto& b : benches) rel = std::max(rel, b->Verify(0).rel_error);
      result.rel_error_last = control_->Reduce<double>(rel, RawFunc(&gloo::max<double>));
      result.verified_last = true;
    }
    if (o_.rank == 0) {
      PrintRow(o_, result);
      if (!o_.csv.empty() && !AppendCsv(o_, result)) {
        std::fprintf(stderr, "optireduce-bench: cannot write --csv file '%s'\n", o_.csv.c_str());
      }
      if (!o_.samples_csv.empty()) AppendSamples(result);
    }
    if (total_mismatches > 0) {
      PrintErrors(total_mismatches, errors);
      return 1;
    }
    return 0;
  }

  void AppendSamples(const SizeResult& r) {
    FILE* f = std::fopen(o_.samples_csv.c_str(), "a");
    if (f == nullptr) {
      std::fprintf(stderr, "optireduce-bench: cannot write --samples-csv file '%s'\n",
                   o_.samples_csv.c_str());
      return;
    }
    if (std::ftell(f) == 0) std::fprintf(f, "benchmark,transport,processes,elements,iteration,us,loss_pct,damaged\n");
    for (size_t i = 0; i < r.nanos.size(); i++) {
      std::fprintf(f, "%s,%s,%d,%zu,%zu,%.3f,%.4f,%d\n", o_.benchmark.c_str(),
                   o_.transport.c_str(), o_.size, r.elements, i, r.nanos[i] / 1e3,
                   100 * r.stats[i].loss_fraction, r.stats[i].damaged ? 1 : 0);
    }
    std::fclose(f);
  }

  // Gloo's error report: a header, then each rank's errors in rank order.
  void PrintErrors(double total, const std::vector<std::string>& errors) {
    control_->Barrier();
    if (o_.rank == 0) {
      std::printf("\n%s\n", std::string(80, '=').c_str());
      std::printf("%40s\n\n", "VERIFY ERRORS");
      std::printf("%.0f mismatching elements in total.", total);
      if (!o_.show_all_errors) std::printf(" Showing at most 20 per rank; --show-all-errors shows all.");
      std::printf("\n");
      std::fflush(stdout);
    }
    for (int r = 0; r < o_.size; r++) {
      control_->Barrier();
      if (r != o_.rank) continue;
      for (const auto& e : errors) std::printf("%s\n", e.c_str());
      std::fflush(stdout);
    }
    control_->Barrier();
  }

  const BenchOptions& o_;
  Rendezvous rv_;
  std::vector<std::shared_ptr<gloo::transport::Device>> devices_;
  std::unique_ptr<Control> control_;
  std::vector<std::shared_ptr<gloo::Context>> contexts_;
  std::unique_ptr<StragglerDist> straggler_;
  int straggler_rank_ = -1;
  std::atomic<uint64_t> draws_{0};
  // The rank threads, kept across batches (warm-up warms their scratch memory too).
  std::unique_ptr<WorkerThreads> workers_;
  size_t workers_count_ = 0;
};

}  // namespace

int RunBenchRank(const BenchOptions& options) {
  try {
    RankRunner runner(options);
    return runner.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optireduce-bench rank %d: %s\n", options.rank, e.what());
    std::fflush(nullptr);
    return 1;
  }
}

int RunBenchLocal(const BenchOptions& options) {
  const int n = options.local_ranks;
  // Generous: every element count may take its timed time several times over, plus the
  // context timeout once (a hang ends by the context timeout first).
  const long sizes = static_cast<long>(ElementCounts(options).size());
  const long per_size =
      std::chrono::duration_cast<std::chrono::seconds>(options.iteration_time).count() * 4 + 60;
  const int limit = static_cast<int>(std::min<long>(
      86400, options.timeout.count() + sizes * per_size +
                 (options.iteration_count > 0 ? options.iteration_count / 10 : 0)));
  return ForkLocalRanks(n, limit, [&](int rank, const std::string& dir) {
    BenchOptions o = options;
    o.local_ranks = 0;
    o.local_child = true;
    o.rank = rank;
    o.size = n;
    o.shared_path = dir;
    o.prefix = "local";
    return RunBenchRank(o);
  });
}

}  // namespace bench
}  // namespace optireduce
