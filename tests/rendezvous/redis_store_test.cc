// RedisStore / RedisKv against a real redis-server (one per test, killed in teardown).
#include "rendezvous/redis_store.h"

#include <stdlib.h>

#include <atomic>
#include <iostream>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "absl/strings/str_cat.h"
#include "algorithms/allreduce.h"
#include "gloo_ext/redis_options.h"
#include "rendezvous/redis_kv.h"
#include "tests/rendezvous/redis_server_fixture.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace rendezvous {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::RedisServer;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A raw hiredis connection, independent of the code under test, to inspect the server.
class RawRedis {
 public:
  explicit RawRedis(int port) {
    struct timeval tv = {2, 0};
    c_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    EXPECT_TRUE(c_ != nullptr && c_->err == 0);
    redisSetTimeout(c_, tv);
    Run({"AUTH", RedisServer::kPassword});
  }
  ~RawRedis() {
    if (c_ != nullptr) redisFree(c_);
  }
  // Returns the reply's integer, or its string in *str.
  long long Run(const std::vector<std::string>& argv, std::string* str = nullptr,
                std::vector<std::string>* elements = nullptr) {
    std::vector<const char*> a;
    std::vector<size_t> l;
    for (auto& s : argv) {
      a.push_back(s.data());
      l.push_back(s.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c_, a.size(), a.data(), l.data()));
    if (r == nullptr) {
      ADD_FAILURE() << "raw redis command failed: " << c_->errstr;
      return -1;
    }
    long long v = r->integer;
    if (str != nullptr && r->str != nullptr) str->assign(r->str, r->len);
    if (r->type == REDIS_REPLY_ERROR) ADD_FAILURE() << "raw redis error: " << r->str;
    if (elements != nullptr && r->type == REDIS_REPLY_ARRAY) {
      // SCAN: [cursor, [keys...]]
      if (r->elements == 2 && r->element[1]->type == REDIS_REPLY_ARRAY) {
        if (str != nullptr) str->assign(r->element[0]->str, r->element[0]->len);
        for (size_t i = 0; i < r->element[1]->elements; ++i) {
          elements->emplace_back(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
        }
      }
    }
    freeReplyObject(r);
    return v;
  }
  std::vector<std::string> Scan(const std::string& pattern) {
    std::vector<std::string> keys;
    std::string cursor = "0";
    do {
      std::string next;
      Run({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, &next, &keys);
      cursor = next;
    } while (cursor != "0" && !cursor.empty());
    return keys;
  }

 private:
  redisContext* c_ = nullptr;
};

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = RedisServer::Start();
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  RedisOptions Options(const std::string& job, int world_size) const {
    RedisOptions o;
    o.url = server_->Url();
    o.job_id = job;
    o.world_size = world_size;
    o.connect_timeout = milliseconds(2000);
    o.op_timeout = milliseconds(2000);
    o.timeout = milliseconds(15000);
    o.key_ttl = std::chrono::seconds(600);
    return o;
  }

  std::unique_ptr<RedisKv> Kv(const RedisOptions& o) {
    auto kv = RedisKv::Connect(o);
    EXPECT_TRUE(kv.ok()) << kv.status();
    return kv.ok() ? *std::move(kv) : nullptr;
  }

  std::unique_ptr<RedisServer> server_;
};

// ---- c10d-style operations ----

TEST_F(RedisStoreTest, KvOperationsFollowC10dSemantics) {
  auto kv = Kv(Options("kvops", 1));
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(*kv->NumKeys(), 0);

  ASSERT_TRUE(kv->Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(**kv->TryGet("a"), std::string("x\0y", 3));  // binary safe
  ASSERT_TRUE(kv->Set("a", "second").ok());                // overwrite, no "already set"
  EXPECT_EQ(*kv->Get("a", milliseconds(100)), "second");
  EXPECT_FALSE(kv->TryGet("nope")->has_value());

  EXPECT_EQ(*kv->Add("ctr", 5), 5);
  EXPECT_EQ(*kv->Add("ctr", -2), 3);
  EXPECT_EQ(*kv->Get("ctr", milliseconds(100)), "3");

  EXPECT_EQ(*kv->CompareSet("cs", "", "v1"), "v1");      // missing + empty expected: set
  EXPECT_EQ(*kv->CompareSet("cs", "wrong", "v2"), "v1");  // mismatch: current value
  EXPECT_EQ(*kv->CompareSet("cs", "v1", "v2"), "v2");     // match: set
  EXPECT_EQ(*kv->CompareSet("missing", "e", "d"), "e");   // missing + expected: expected
  EXPECT_FALSE(kv->TryGet("missing")->has_value());

  EXPECT_TRUE(*kv->Check({"a", "ctr", "cs"}));
  EXPECT_FALSE(*kv->Check({"a", "nope"}));
  EXPECT_EQ(*kv->NumKeys(), 3);

  EXPECT_TRUE(*kv->DeleteKey("a"));
  EXPECT_FALSE(*kv->DeleteKey("a"));
  EXPECT_EQ(*kv->NumKeys(), 2);

  // Wait returns once another client writes the key.
  auto writer = Kv(Options("kvops-writer", 1));  // different job: must not satisfy the wait
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Set("late", "w").ok());
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE(kv->Set("late", "1").ok());
  });
  absl::Status waited = kv->Wait({"late", "ctr"}, milliseconds(5000));
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST_F(RedisStoreTest, WaitTimeoutThrowsIoExceptionNamingMissingKeys) {
  auto store = RedisStore::Connect(Options("waitjob", 1));
  ASSERT_TRUE(store.ok()) << store.status();
  (*store)->set("present", {'1'});
  const auto start = Clock::now();
  try {
    (*store)->wait({"present", "absent-key"}, milliseconds(300));
    FAIL() << "wait did not time out";
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("absent-key"), std::string::npos) << what;
    EXPECT_EQ(what.find("present,"), std::string::npos) << what;  // only missing ones named
    EXPECT_NE(what.find("timed out"), std::string::npos) << what;
  }
  EXPECT_LT(SecondsSince(start), 0.3 + 5.0);
  // get() of a key that never comes is bounded too (by options.timeout).
  RedisOptions o = Options("waitjob2", 1);
  o.timeout = milliseconds(200);
  auto s2 = RedisStore::Connect(o);
  ASSERT_TRUE(s2.ok());
  EXPECT_THROW((*s2)->get("never"), gloo::IoException);
}

// ---- Gloo rendezvous ----

struct RankResult {
  std::vector<float> data;
  std::vector<float> tar;  // the same inputs reduced by TAR (our UDP device only)
  std::string error;
};

constexpr int kElements = 1000;

enum class Device { kGlooTcp, kOurUdp };

std::shared_ptr<gloo::transport::Device> MakeDevice(Device device) {
  if (device == Device::kOurUdp) {
    transport::udp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = transport::udp::CreateDeviceOrError(attr);
    if (!dev.ok()) throw std::runtime_error(dev.status().ToString());
    return *dev;
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return gloo::transport::tcp::CreateDevice(attr);
}

// One rank: rendezvous through Redis, the device, allreduce(sum) — Gloo's ring, and with our
// UDP device also TAR (optireduce::allreduce) — then Finish.
void RunRank(const RedisOptions& options, int rank, int size, float base, RankResult* out,
             Device device) {
  try {
    auto store = RedisStore::Connect(options);
    if (!store.ok()) {
      out->error = store.status().ToString();
      return;
    }
    auto dev = MakeDevice(device);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(milliseconds(15000));
    ctx->connectFullMesh(**store, dev);
    // This rank's inputs into `v`, and `opts` set to sum them in place.
    auto sum_of = [&](std::vector<float>* v, gloo::AllreduceOptions* opts) {
      v->resize(kElements);
      for (int i = 0; i < kElements; ++i) (*v)[i] = base + (rank + 1) + (i % 7);
      opts->setOutput(v->data(), v->size());
      opts->setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::sum<float>));
      opts->setTimeout(milliseconds(15000));
    };
    gloo::AllreduceOptions opts(ctx);
    sum_of(&out->data, &opts);
    gloo::allreduce(opts);
    if (device == Device::kOurUdp) {
      // The same inputs again, reduced by TAR over the same context.
      optireduce::AllreduceOptions tar(ctx);
      sum_of(&out->tar, &tar);
      optireduce::allreduce(tar);
    }
    absl::Status finished = (*store)->Finish();
    if (!finished.ok()) out->error = finished.ToString();
  } catch (const std::exception& e) {
    out->error = e.what();
  }
}

// Expected sum over ranks r of (base + r + 1 + i % 7); small integers, exact in float.
void ExpectAllreduced(const std::vector<RankResult>& results, float base) {
  const int size = results.size();
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(results[r].error, "") << "rank " << r;
    ASSERT_EQ(results[r].data.size(), static_cast<size_t>(kElements));
    for (int i = 0; i < kElements; ++i) {
      const float want = size * base + size * (size + 1) / 2 + size * (i % 7);
      ASSERT_EQ(results[r].data[i], want) << "rank " << r << " element " << i;
    }
  }
}

std::vector<RankResult> RunJob(const RedisOptions& options, float base,
                               Device device = Device::kGlooTcp) {
  const int size = options.world_size;
  std::vector<RankResult> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back(RunRank, options, r, size, base, &results[r], device);
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST_F(RedisStoreTest, FourRanksAllreduceAndLeaveNothingBehind) {
  RedisOptions o = Options("job-a", 4);
  ExpectAllreduced(RunJob(o, 1.0f), 1.0f);
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Scan("optireduce/job-a/*"), std::vector<std::string>{});
}

TEST_F(RedisStoreTest, FourRanksOverOurUdpDevice) {
  RedisOptions o = Options("job-udp", 4);
  const std::vector<RankResult> results = RunJob(o, 2.0f, Device::kOurUdp);
  ExpectAllreduced(results, 2.0f);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(results[r].tar.size(), results[r].data.size()) << "rank " << r;
    for (int i = 0; i < kElements; ++i) {
      ASSERT_EQ(results[r].tar[i], results[r].data[i]) << "rank " << r << " element " << i;
    }
  }
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Scan("optireduce/job-udp/*"), std::vector<std::string>{});
}

TEST_F(RedisStoreTest, SameJobIdTwiceInARow) {
  RedisOptions o = Options("job-again", 4);
  ExpectAllreduced(RunJob(o, 1.0f), 1.0f);
  ExpectAllreduced(RunJob(o, 2.0f), 2.0f);  // no "already set", no stale addresses
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Scan("optireduce/job-again/*"), std::vector<std::string>{});
}

TEST_F(RedisStoreTest, RunAfterACrashedRunDoesNotSeeItsKeys) {
  RedisOptions o = Options("job-crash", 4);
  std::vector<std::unique_ptr<RedisKv>> run1;
  for (int r = 0; r < 4; ++r) {
    run1.push_back(Kv(o));
    ASSERT_NE(run1.back(), nullptr);
    ASSERT_TRUE(run1.back()->Set(std::to_string(r), "stale-address").ok());
  }
  const std::string crashed_prefix = run1[0]->run_prefix();
  // Rank 3 "crashes": it does not finish while run 2 starts (to Redis a crashed rank and
  // a hung one look the same). Ranks 0..2 finish cleanly.
  std::unique_ptr<RedisKv> crashed = std::move(run1[3]);
  run1.clear();

  std::vector<std::unique_ptr<RedisKv>> run2;
  for (int r = 0; r < 4; ++r) {
    run2.push_back(Kv(o));
    ASSERT_NE(run2.back(), nullptr);
  }
  EXPECT_NE(run2[0]->run_prefix(), crashed_prefix);
  EXPECT_FALSE(*run2[0]->Check({"0"}));
  EXPECT_EQ(*run2[0]->NumKeys(), 0);
  // The crashed run's keys are still there (until their TTL), untouched by run 2.
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Run({"EXISTS", crashed_prefix + "k/0"}), 1);
  EXPECT_GT(raw.Run({"TTL", crashed_prefix + "k/0"}), 0);
}

TEST_F(RedisStoreTest, TwoJobsConcurrentlyOnOneRedis) {
  RankResult dummy;
  std::vector<RankResult> a, b;
  std::thread ta([&] { a = RunJob(Options("job-x", 4), 3.0f); });
  std::thread tb([&] { b = RunJob(Options("job-y", 4), 5.0f); });
  ta.join();
  tb.join();
  ExpectAllreduced(a, 3.0f);
  ExpectAllreduced(b, 5.0f);
  RawRedis raw(server_->port());
  EXPECT_EQ(raw.Scan("optireduce/*"), std::vector<std::string>{});
}

// ---- expiry and cleanup ----

TEST_F(RedisStoreTest, EveryKeyHasTtlAndFinishDeletesTheRun) {
  RedisOptions o = Options("job-ttl", 2);
  o.key_ttl = std::chrono::seconds(120);
  auto r0 = Kv(o);
  auto r1 = Kv(o);
  ASSERT_NE(r0, nullptr);
  ASSERT_NE(r1, nullptr);
  ASSERT_TRUE(r0->Set("k0", "v").ok());
  ASSERT_TRUE(r1->Add("k1", 1).ok());
  ASSERT_EQ(*r1->CompareSet("k2", "", "v"), "v");
  RawRedis raw(server_->port());
  const auto keys = raw.Scan("optireduce/job-ttl/*");
  EXPECT_GE(keys.size(), 5u);  // joins, 3 user keys, key set
  for (const auto& k : keys) {
    const long long ttl = raw.Run({"TTL", k});
    EXPECT_GT(ttl, 0) << k;
    EXPECT_LE(ttl, 120) << k;
  }
  ASSERT_TRUE(r0->Finish().ok());
  EXPECT_TRUE(*r1->Check({"k0", "k1"}));  // still there until the last rank finishes
  ASSERT_TRUE(r1->Finish().ok());
  ASSERT_TRUE(r1->Finish().ok());  // idempotent
  EXPECT_EQ(raw.Scan("optireduce/job-ttl/*"), std::vector<std::string>{});
}

// ---- configuration ----

TEST_F(RedisStoreTest, AclUserAndSelectDb) {
  RawRedis raw(server_->port());
  raw.Run({"ACL", "SETUSER", "alice", "on", ">alicepw", "~*", "+@all"});
  RedisOptions o = Options("job-acl", 1);
  o.url = absl::StrCat("redis://alice:alicepw@127.0.0.1:", server_->port(), "/2");
  auto kv = Kv(o);
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(kv->Set("k", "v").ok());
  EXPECT_EQ(raw.Run({"EXISTS", kv->RedisKey("k")}), 0);  // not in db 0
  raw.Run({"SELECT", "2"});
  EXPECT_EQ(raw.Run({"EXISTS", kv->RedisKey("k")}), 1);

  o.url = absl::StrCat("redis://alice:wrong@127.0.0.1:", server_->port());
  auto bad = RedisKv::Connect(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(bad.status().message().find("user 'alice'"), std::string::npos) << bad.status();
}

TEST_F(RedisStoreTest, BadOptionsAreRejected) {
  RedisOptions o = Options("", 1);
  EXPECT_EQ(RedisStore::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options("a/b", 1);
  EXPECT_NE(RedisStore::Connect(o).status().message().find("job_id"), std::string::npos);
  o = Options("j", 0);
  EXPECT_NE(RedisStore::Connect(o).status().message().find("world_size"), std::string::npos);
  o = Options("j", 1);
  o.url = "redis://127.0.0.1:notaport";
  auto s = RedisStore::Connect(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("port"), std::string::npos) << s.status();
}

// RedisStore::Connect(gloo_ext::RedisOptionsFromEnvironment(job_id, world_size)).
absl::StatusOr<std::shared_ptr<RedisStore>> ConnectFromEnv(absl::string_view job_id,
                                                           int world_size) {
  auto options = gloo_ext::RedisOptionsFromEnvironment(job_id, world_size);
  if (!options.ok()) return options.status();
  return RedisStore::Connect(*options);
}

TEST_F(RedisStoreTest, ConnectFromEnv) {
  ::unsetenv("OPTIREDUCE_REDIS_URL");
  auto missing = ConnectFromEnv("envjob", 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("OPTIREDUCE_REDIS_URL"), std::string::npos);
  ::setenv("OPTIREDUCE_REDIS_URL", server_->Url().c_str(), 1);
  auto store = ConnectFromEnv("envjob", 1);
  ::unsetenv("OPTIREDUCE_REDIS_URL");
  ASSERT_TRUE(store.ok()) << store.status();
  (*store)->set("k", {'v'});
  EXPECT_EQ((*store)->get("k"), std::vector<char>{'v'});
}

// ---- faults: clear errors, bounded in time, never a hang ----

TEST_F(RedisStoreTest, WrongPasswordFailsClearly) {
  RedisOptions o = Options("job-pw", 1);
  o.url = absl::StrCat("redis://:not-the-password@127.0.0.1:", server_->port());
  const auto start = Clock::now();
  auto s = RedisStore::Connect(o);
  std::cerr << "reported: " << s.status() << "\n";
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  EXPECT_NE(s.status().message().find("AUTH"), std::string::npos) << s.status();
  EXPECT_EQ(s.status().message().find("not-the-password"), std::string::npos);
  EXPECT_LT(SecondsSince(start), 2.0 + 5.0);

  o.url = absl::StrCat("redis://127.0.0.1:", server_->port());  // no password at all
  s = RedisStore::Connect(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  EXPECT_NE(s.status().message().find("requires authentication"), std::string::npos)
      << s.status();
}

TEST(RedisStoreFaultTest, UnreachableHostFailsWithinConnectTimeout) {
  RedisOptions o;
  o.url = absl::StrCat("redis://127.0.0.1:", testing::FreeLoopbackPort());
  o.job_id = "job-unreachable";
  o.world_size = 1;
  o.connect_timeout = milliseconds(1000);
  const auto start = Clock::now();
  auto s = RedisStore::Connect(o);
  std::cerr << "reported after " << SecondsSince(start) << " s: " << s.status() << "\n";
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("cannot connect"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("refused"), std::string::npos) << s.status();
  EXPECT_LT(SecondsSince(start), 1.0 + 5.0);
}

TEST_F(RedisStoreTest, ServerKilledDuringWaitFailsWithinTimeout) {
  RedisOptions o = Options("job-killed", 2);
  o.op_timeout = milliseconds(1000);
  auto store = RedisStore::Connect(o);
  ASSERT_TRUE(store.ok()) << store.status();
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server_->Kill();
  });
  const auto start = Clock::now();
  std::string what;
  try {
    (*store)->wait({"never-comes"}, milliseconds(4000));
  } catch (const gloo::IoException& e) {
    what = e.what();
  }
  killer.join();
  std::cerr << "reported after " << SecondsSince(start) << " s: " << what << "\n";
  ASSERT_NE(what, "") << "wait returned although the key never came";
  EXPECT_NE(what.find("never-comes"), std::string::npos) << what;
  EXPECT_TRUE(what.find("refused") != std::string::npos ||
              what.find("connection lost") != std::string::npos)
      << what;
  EXPECT_LT(SecondsSince(start), 4.0 + 5.0);
  // Finish (from the destructor) with the server gone must not hang either.
  const auto finish_start = Clock::now();
  absl::Status finished = (*store)->Finish();
  std::cerr << "finish reported after " << SecondsSince(finish_start) << " s: " << finished
            << "\n";
  EXPECT_FALSE(finished.ok());
  store->reset();
  EXPECT_LT(SecondsSince(finish_start), 2 * 1.0 + 5.0);
}

TEST_F(RedisStoreTest, HungServerFailsWithinOpTimeout) {
  RedisOptions o = Options("job-hung", 1);
  o.op_timeout = milliseconds(500);
  auto kv = Kv(o);
  ASSERT_NE(kv, nullptr);
  server_->Pause();
  const auto start = Clock::now();
  auto v = kv->TryGet("k");
  const double elapsed = SecondsSince(start);
  server_->Resume();
  std::cerr << "reported after " << elapsed << " s: " << v.status() << "\n";
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(v.status().message().find("no reply within"), std::string::npos) << v.status();
  EXPECT_LT(elapsed, 0.5 + 5.0);
  // A wait shorter than op_timeout is not held up by the hung server beyond its own timeout.
  o.op_timeout = milliseconds(3000);
  auto kv2 = Kv(o);
  ASSERT_NE(kv2, nullptr);
  server_->Pause();
  const auto wait_start = Clock::now();
  absl::Status waited = kv2->Wait({"k"}, milliseconds(300));
  const double wait_elapsed = SecondsSince(wait_start);
  server_->Resume();
  std::cerr << "wait reported after " << wait_elapsed << " s: " << waited << "\n";
  EXPECT_FALSE(waited.ok());
  EXPECT_LT(wait_elapsed, 3.0);  // well below op_timeout: the wait's deadline bounded it
  // Once the server answers again the same store works (fresh connection).
  auto again = kv->TryGet("k");
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(RedisStoreTest, ReconnectsAfterTheServerDropsTheConnection) {
  auto kv = Kv(Options("job-reconnect", 1));
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(kv->Set("k", "v").ok());
  RawRedis raw(server_->port());
  EXPECT_GE(raw.Run({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}), 1);
  auto v = kv->TryGet("k");  // idempotent: reconnects and retries
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(**v, "v");
  raw.Run({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  auto added = kv->Add("n", 1);  // non-idempotent: reported, not repeated
  ASSERT_FALSE(added.ok());
  EXPECT_NE(added.status().message().find("unknown"), std::string::npos) << added.status();
  EXPECT_EQ(*kv->Add("n", 1), 1);  // next call uses a fresh connection
}

}  // namespace
}  // namespace rendezvous
}  // namespace optireduce
