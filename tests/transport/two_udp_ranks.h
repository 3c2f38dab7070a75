// Two ranks of one job as threads of the test process, each with its own udp device,
// connected through a HashStore: the set-up of the transport tests that drive the Gloo
// API and read the engines' counters.
#pragma once

#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport_dpdk/device.h"
#include "transport_dpdk/engine.h"

namespace optireduce {
namespace testing_ranks {

struct Rank {
  std::shared_ptr<transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
};

// Two connected ranks over udp devices made with `engine` options (and `faults`, see
// fault_injector.h, injected by both). Empty (and a test failure) if a device fails.
inline std::vector<Rank> Connect(const transport::EngineOptions& engine,
                                 const std::string& faults = "") {
  gloo::rendezvous::HashStore store;
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) {
    transport::udp::attr a;
    a.engine = engine;
    a.engine.faults = faults;
    auto dev = transport::udp::CreateDeviceOrError(a);
    EXPECT_TRUE(dev.ok()) << dev.status();
    if (!dev.ok()) return {};
    r.device = *dev;
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      ranks[i].context = std::make_shared<gloo::rendezvous::Context>(i, 2);
      ranks[i].context->setTimeout(std::chrono::seconds(30));
      std::shared_ptr<gloo::transport::Device> dev = ranks[i].device;
      ranks[i].context->connectFullMesh(store, dev);
    });
  }
  for (auto& t : threads) t.join();
  return ranks;
}

inline void Barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions b(ctx);
  b.setTag(1);
  gloo::barrier(b);
}

}  // namespace testing_ranks
}  // namespace optireduce
