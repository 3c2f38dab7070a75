// Two ranks (threads) over the installed library's UDP device: TAR and OptiReduce mode
// allreduce, with the headers in their layer folders. Prints "ok" and exits 0 on success.
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/math.h>

#include <algorithms/allreduce.h>
#include <transport_dpdk/device.h>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
  gloo::rendezvous::HashStore store;
  int failures = 0;
  auto rank_main = [&](int rank) {
    auto dev = optireduce::transport::udp::CreateDevice({});
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    ctx->connectFullMesh(store, dev);
    for (auto mode : {optireduce::AllreduceOptions::Mode::kReliable,
                      optireduce::AllreduceOptions::Mode::kBounded}) {
      std::vector<float> v(1000, float(rank + 1));
      optireduce::AllreduceOptions opts(ctx);
      opts.setOutput(v.data(), v.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setMode(mode);
      optireduce::allreduce(opts);
      for (float x : v) {
        if (x < 2.999f || x > 3.001f) {
          std::fprintf(stderr, "rank %d: got %f, want 3\n", rank, x);
          failures++;
          return;
        }
      }
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  if (failures != 0) return 1;
  std::puts("ok");
  return 0;
}
