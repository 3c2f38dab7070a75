// Two ranks of one job as threads of the test process, each with its own device (udp, or
// any of ours the caller made), connected through a HashStore: the set-up of the transport
// tests that drive the Gloo API and read the engines' counters, and the preposted
// ping-pong several of them measure.
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
#include "transport_dpdk/engine/engine.h"

namespace optireduce {
namespace testing_ranks {

struct Rank {
  std::shared_ptr<transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
};

// Two ranks connected over `devices` (one each), their contexts' timeout 30 s.
inline std::vector<Rank> ConnectDevices(const std::vector<std::shared_ptr<transport::Device>>& devices) {
  gloo::rendezvous::HashStore store;
  std::vector<Rank> ranks(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    ranks[i].device = devices[i];
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

// Two connected ranks over udp devices made with `engine` options (and `faults`, see
// fault_injector.h, injected by both). Empty (and a test failure) if a device fails.
inline std::vector<Rank> Connect(const transport::EngineOptions& engine,
                                 const std::string& faults = "") {
  std::vector<std::shared_ptr<transport::Device>> devices;
  for (int i = 0; i < 2; ++i) {
    transport::EngineOptions options = engine;
    options.faults = faults;
    auto dev = transport::udp::CreateDeviceOrError(transport::udp::attr(), options);
    EXPECT_TRUE(dev.ok()) << dev.status();
    if (!dev.ok()) return {};
    devices.push_back(*dev);
  }
  return ConnectDevices(devices);
}

// `messages` round trips of one int between the two ranks, every receive posted before its
// message arrives (as collectives post theirs); returns both ranks' counters' growth.
inline transport::Stats PrepostedPingPong(std::vector<Rank>& ranks, int messages) {
  const auto before0 = ranks[0].device->stats(), before1 = ranks[1].device->stats();
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto& ctx = ranks[i].context;
      int out = 0, in = -1;
      auto send_buf = ctx->createUnboundBuffer(&out, sizeof(out));
      auto recv_buf = ctx->createUnboundBuffer(&in, sizeof(in));
      const int other = 1 - i;
      // Rank 0 sends even values on slot 2m, rank 1 answers value + 1 on slot 2m + 1.
      recv_buf->recv(other, i == 0 ? 1 : 0);
      for (int m = 0; m < messages; ++m) {
        if (i == 0) {
          out = 2 * m;
          send_buf->send(1, 2 * m);
          recv_buf->waitRecv();
          EXPECT_EQ(in, 2 * m + 1);
          if (m + 1 < messages) recv_buf->recv(1, 2 * m + 3);
          send_buf->waitSend();
        } else {
          recv_buf->waitRecv();
          EXPECT_EQ(in, 2 * m);
          out = in + 1;
          if (m + 1 < messages) recv_buf->recv(0, 2 * m + 2);
          send_buf->send(0, 2 * m + 1);
          send_buf->waitSend();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  transport::Stats grown = ranks[0].device->stats();
  grown += ranks[1].device->stats();
  transport::Stats before = before0;
  before += before1;
  transport::Stats d;
#define OPTIREDUCE_TEST_DELTA(name) d.name = grown.name - before.name;
  OPTIREDUCE_ENGINE_COUNTERS(OPTIREDUCE_TEST_DELTA)
#undef OPTIREDUCE_TEST_DELTA
  return d;
}

inline void Barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions b(ctx);
  b.setTag(1);
  gloo::barrier(b);
}

}  // namespace testing_ranks
}  // namespace optireduce
