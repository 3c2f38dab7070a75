// transport_worker: one rank of a multi-process transport test, started by
// the gtest binaries (fork + exec). Exit code 0 = success; anything else is
// a failure described on stderr.
//
//   transport_worker --mode=conformance|kill|forged|isolation|early_exit --rank=R --size=N
//                    --store=DIR [--cases=a,b] [--sizes=0,1,1024]
//                    [--faults=SPEC] [--timeout_ms=T] [--info=DIR]
//                    [--seed=S] [--role=attacked|bystander]   (isolation)
#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/file_store.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/gloo/address.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/io/udp/packet_io_udp.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

void SumFn(void* c, const void* a, const void* b, size_t n) {
  gloo::sum<int32_t>(c, a, b, n);
}

// Allreduce of n int32 with exact check; returns "" on success. `seed` makes
// the data of concurrent jobs differ. When `flag` is given, one extra element
// carries *flag from every rank and returns the sum in *flag (so all ranks
// agree on when to stop a loop).
std::string CheckedAllreduce(const std::shared_ptr<gloo::Context>& ctx, size_t n,
                             int seed = 0, int32_t* flag = nullptr) {
  std::vector<int32_t> v(n + (flag ? 1 : 0));
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<int32_t>((ctx->rank + 1) * ((i + seed) % 101));
  }
  if (flag) v[n] = *flag;
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(&SumFn);
  gloo::allreduce(o);
  const int N = ctx->size;
  for (size_t i = 0; i < n; ++i) {
    const int32_t want = static_cast<int32_t>(((i + seed) % 101) * N * (N + 1) / 2);
    if (v[i] != want) {
      return "allreduce element " + std::to_string(i) + " = " + std::to_string(v[i]) +
             ", expected " + std::to_string(want);
    }
  }
  if (flag) *flag = v[n];
  return "";
}

// Publishes what a forger needs to reach this rank: UDP port, context id and
// the job's session token (as seen on the pair to `peer`).
void PublishTarget(const std::shared_ptr<gloo::Context>& ctx, int peer,
                   const std::string& info_dir) {
  auto& pair = ctx->getPair(peer);
  auto addr = optireduce::transport::Address::FromBytes(pair->address().bytes());
  uint16_t port_be;
  std::memcpy(&port_be, &addr->io()[2], 2);
  std::ofstream(info_dir + "/target.tmp")
      << ntohs(port_be) << " " << addr->context_id() << " " << addr->token() << "\n";
  rename((info_dir + "/target.tmp").c_str(), (info_dir + "/target").c_str());
}

uint64_t MalformedTotal(const optireduce::transport::Stats& s) {
  uint64_t n = 0;
  for (uint64_t m : s.malformed) n += m;
  return n;
}

bool WaitForFile(const std::string& path, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) {
      fprintf(stderr, "transport_worker: bad argument '%s' (want --key=value)\n", argv[i]);
      return 2;
    }
    args[a.substr(2, a.find('=') - 2)] = a.substr(a.find('=') + 1);
  }
  const std::string mode = args["mode"];
  const int rank = std::stoi(args["rank"]);
  const int size = std::stoi(args["size"]);
  const auto timeout = std::chrono::milliseconds(
      args.count("timeout_ms") ? std::stol(args["timeout_ms"]) : 30000);
  try {
    optireduce::transport::EngineOptions engine;
    engine.faults = args["faults"];
    auto device = optireduce::transport::udp::CreateDeviceOrError(
        optireduce::transport::udp::attr(), engine);
    if (!device.ok()) {
      fprintf(stderr, "rank %d: %s\n", rank, device.status().ToString().c_str());
      return 2;
    }
    gloo::rendezvous::FileStore store(args["store"]);
    auto ctx = optireduce::testing::ConnectContext(store, *device, rank, size, timeout);

    if (mode == "conformance") {
      std::vector<std::string> cases = args.count("cases")
                                           ? Split(args["cases"])
                                           : optireduce::testing::AllCaseNames();
      for (const auto& name : cases) {
        for (const auto& sz : Split(args["sizes"])) {
          std::string err = optireduce::testing::RunCase(name, ctx, std::stoul(sz));
          if (!err.empty()) {
            fprintf(stderr, "%s\n", err.c_str());
            return 1;
          }
        }
      }
      return 0;
    }

    if (mode == "early_exit") {
      // Rank 0 receives from any of ranks 1 and 2, twice, on one slot. Rank 2 sends, closes
      // its context and device and exits; rank 1 sends only after rank 2 is gone and a
      // second has passed (long enough for rank 0's liveness probes to reach the closed
      // port). A peer that closed after delivering everything fails nothing of rank 0's.
      const uint64_t slot = gloo::Slot::build(0x51, 0);
      int32_t value = 1000 + rank;
      if (rank == 0) {
        int32_t got_value = 0;
        auto rb = ctx->createUnboundBuffer(&got_value, sizeof(got_value));
        int seen = 0;
        for (int k = 0; k < 2; ++k) {
          int src = -1;
          rb->recv(std::vector<int>{1, 2}, slot);
          rb->waitRecv(&src, timeout);
          if (got_value != 1000 + src) {
            fprintf(stderr, "rank 0: from rank %d got %d\n", src, got_value);
            return 1;
          }
          seen |= 1 << src;
        }
        return seen == 6 ? 0 : 1;
      }
      if (rank == 1 && !WaitForFile(args["info"] + "/closed.2", timeout)) {
        fprintf(stderr, "rank 1: rank 2 never closed\n");
        return 1;
      }
      if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(1));  // computes
      auto sb = ctx->createUnboundBuffer(&value, sizeof(value));
      sb->send(0, slot);
      sb->waitSend(timeout);
      if (rank == 2) {
        sb.reset();
        ctx.reset();
        device->reset();  // waits for the context's close handshake, then closes the socket
        std::ofstream(args["info"] + "/closed.2") << "1";
      }
      return 0;
    }

    if (mode == "kill") {
      // Allreduce until a peer dies: the failure must be a gloo::IoException,
      // whose wall-clock time we publish for the parent to bound.
      for (;;) {
        std::string err;
        try {
          err = CheckedAllreduce(ctx, 1 << 18);
        } catch (const gloo::IoException& e) {
          timespec ts;
          clock_gettime(CLOCK_REALTIME, &ts);
          std::ofstream(args["info"] + "/failed." + std::to_string(rank))
              << (ts.tv_sec * 1000LL + ts.tv_nsec / 1000000) << "\n";
          fprintf(stderr, "rank %d: IoException (expected): %.300s\n", rank, e.what());
          return 0;
        }
        if (!err.empty()) {
          fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
          return 1;
        }
        if (access((args["info"] + "/started." + std::to_string(rank)).c_str(), F_OK) != 0) {
          std::ofstream(args["info"] + "/started." + std::to_string(rank)) << "1";
        }
      }
    }

    if (mode == "forged") {
      std::string err = CheckedAllreduce(ctx, 1 << 18);
      if (!err.empty()) {
        fprintf(stderr, "rank %d before forgery: %s\n", rank, err.c_str());
        return 1;
      }
      const auto before = (*device)->stats();
      if (rank == 0) {
        // Publish what a forger needs: our UDP port, context id and token.
        PublishTarget(ctx, 1, args["info"]);
      }
      if (!WaitForFile(args["info"] + "/forged", std::chrono::seconds(30))) {
        fprintf(stderr, "rank %d: forger never finished\n", rank);
        return 1;
      }
      for (int i = 0; i < 3; ++i) {
        err = CheckedAllreduce(ctx, 1 << 18);
        if (!err.empty()) {
          fprintf(stderr, "rank %d after forgery: %s\n", rank, err.c_str());
          return 1;
        }
      }
      const auto after = (*device)->stats();
      if (rank == 0) {
        using optireduce::transport::ParseError;
        const auto bounds = static_cast<int>(ParseError::kBadBounds);
        const auto crc = static_cast<int>(ParseError::kBadChecksum);
        struct { const char* name; uint64_t b, a; } checks[] = {
            {"bad_token", before.bad_token, after.bad_token},
            {"bad_rank", before.bad_rank, after.bad_rank},
            {"bad_context", before.bad_context, after.bad_context},
            {"unknown_message", before.unknown_message, after.unknown_message},
            {"out_of_window", before.out_of_window, after.out_of_window},
            {"malformed bad_bounds", before.malformed[bounds], after.malformed[bounds]},
            {"malformed bad_checksum", before.malformed[crc], after.malformed[crc]},
        };
        for (auto& c : checks) {
          if (c.a <= c.b) {
            fprintf(stderr, "rank 0: counter %s did not increase (%lu -> %lu): %s\n", c.name,
                    (unsigned long)c.b, (unsigned long)c.a, after.ToString().c_str());
            return 1;
          }
        }
        printf("rank 0 stats: %s\n", after.ToString().c_str());
      }
      return 0;
    }
    if (mode == "isolation") {
      // One job among several on this host. Allreduce (exactly) until the test
      // says the attack on the "attacked" job is over, then check rank 0's drop
      // counters: the attacked job counted every kind of bad packet, a
      // bystander job saw none of them.
      const int seed = args.count("seed") ? std::stoi(args["seed"]) : 0;
      const std::string role = args["role"];
      const size_t n = 1 << 16;
      std::string err = CheckedAllreduce(ctx, n, seed);
      const auto before = (*device)->stats();
      for (int i = 0; i < 2 && err.empty(); ++i) err = CheckedAllreduce(ctx, n, seed);
      if (!err.empty()) {
        fprintf(stderr, "rank %d before the attack: %s\n", rank, err.c_str());
        return 1;
      }
      if (rank == 0) PublishTarget(ctx, 1, args["info"]);
      const auto give_up = Clock::now() + std::chrono::seconds(45);
      int iterations = 0;
      for (int32_t done = 0; done == 0; ++iterations) {
        done = rank == 0 && (access((args["info"] + "/done").c_str(), F_OK) == 0 ||
                             Clock::now() > give_up);
        err = CheckedAllreduce(ctx, n, seed, &done);
        if (!err.empty()) {
          fprintf(stderr, "rank %d during the attack (iteration %d): %s\n", rank,
                  iterations, err.c_str());
          return 1;
        }
      }
      for (int i = 0; i < 3 && err.empty(); ++i) err = CheckedAllreduce(ctx, n, seed);
      if (!err.empty()) {
        fprintf(stderr, "rank %d after the attack: %s\n", rank, err.c_str());
        return 1;
      }
      if (rank != 0) return 0;
      const auto after = (*device)->stats();
      struct { const char* name; uint64_t b, a; } checks[] = {
          {"malformed", MalformedTotal(before), MalformedTotal(after)},
          {"bad_token", before.bad_token, after.bad_token},
          {"bad_context", before.bad_context, after.bad_context},
          {"bad_rank", before.bad_rank, after.bad_rank},
          {"duplicates", before.duplicates, after.duplicates},
      };
      for (auto& c : checks) {
        // A bystander's duplicates may grow from its own retransmissions.
        const bool grew = c.a > c.b;
        if (role == "attacked" && !grew) {
          fprintf(stderr, "rank 0: counter %s did not increase (%lu -> %lu): %s\n", c.name,
                  (unsigned long)c.b, (unsigned long)c.a, after.ToString().c_str());
          return 1;
        }
        if (role == "bystander" && grew && std::string(c.name) != "duplicates") {
          fprintf(stderr, "rank 0: bystander counted %s drops (%lu -> %lu): %s\n", c.name,
                  (unsigned long)c.b, (unsigned long)c.a, after.ToString().c_str());
          return 1;
        }
      }
      if (access((args["info"] + "/done").c_str(), F_OK) != 0) {
        fprintf(stderr, "rank 0: the test never finished its attack\n");
        return 1;
      }
      printf("rank 0 (%s, %d iterations during the attack) stats: %s\n", role.c_str(),
             iterations, after.ToString().c_str());
      return 0;
    }
    fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const gloo::IoException& e) {
    fprintf(stderr, "rank %d: IoException: %s\n", rank, e.what());
    return mode == "kill" ? 0 : 3;
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %d: exception: %s\n", rank, e.what());
    return 4;
  }
}
