// Unit tests of gloo_ext/config.h: every variable parses, every bad value fails with a
// message naming the variable, the value and what is allowed.
#include "gloo_ext/config.h"

#include <map>
#include <string>

#include "algorithms/allreduce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace optireduce {
namespace gloo_ext {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<Config> Parse(std::map<std::string, std::string> env) {
  return ParseConfig([env](absl::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

std::string ErrorOf(std::map<std::string, std::string> env) {
  absl::StatusOr<Config> c = Parse(std::move(env));
  EXPECT_FALSE(c.ok());
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  absl::StatusOr<Config> c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->algo, Algo::kRing);
  EXPECT_EQ(c->hadamard, HadamardSetting::kDefault);
  EXPECT_EQ(c->timeout.count(), 0);
  EXPECT_DOUBLE_EQ(c->max_loss, 0.05);
  // The C++ API and optireduce-bench default to the same limit.
  EXPECT_DOUBLE_EQ(c->max_loss, AllreduceOptions::kDefaultMaxLoss);
  EXPECT_EQ(c->udp_port_base, 0);
  EXPECT_TRUE(c->faults.empty());
  EXPECT_TRUE(c->sources.empty());
}

TEST(ConfigTest, AlgoIsCaseInsensitive) {
  EXPECT_EQ(Parse({{"GLOO_ALGO", "ring"}})->algo, Algo::kRing);
  EXPECT_EQ(Parse({{"GLOO_ALGO", "Transpose"}})->algo, Algo::kTranspose);
  // The original project's exact spelling and the docs' one both work here.
  EXPECT_EQ(Parse({{"GLOO_ALGO", "Optireduce"}})->algo, Algo::kOptiReduce);
  EXPECT_EQ(Parse({{"GLOO_ALGO", "OptiReduce"}})->algo, Algo::kOptiReduce);
  EXPECT_EQ(Parse({{"GLOO_ALGO", " optireduce "}})->algo, Algo::kOptiReduce);
  EXPECT_EQ(Parse({{"GLOO_ALGO", ""}})->algo, Algo::kRing);  // empty = unset
}

TEST(ConfigTest, UnknownAlgoNamesVariableValueAndAllowed) {
  EXPECT_THAT(ErrorOf({{"GLOO_ALGO", "bcube"}}),
              AllOf(HasSubstr("GLOO_ALGO"), HasSubstr("'bcube'"), HasSubstr("ring"),
                    HasSubstr("transpose"), HasSubstr("optireduce")));
}

TEST(ConfigTest, Hadamard) {
  EXPECT_EQ(Parse({{"OPTIREDUCE_HADAMARD", "1"}})->hadamard, HadamardSetting::kOn);
  EXPECT_EQ(Parse({{"OPTIREDUCE_HADAMARD", "ON"}})->hadamard, HadamardSetting::kOn);
  EXPECT_EQ(Parse({{"OPTIREDUCE_HADAMARD", "0"}})->hadamard, HadamardSetting::kOff);
  EXPECT_EQ(Parse({{"OPTIREDUCE_HADAMARD", "false"}})->hadamard, HadamardSetting::kOff);
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_HADAMARD", "2"}}),
              AllOf(HasSubstr("OPTIREDUCE_HADAMARD"), HasSubstr("'2'"), HasSubstr("0, 1")));
}

// What GLOO_ALGO=optireduce (and optireduce-bench's defaults) pass to the library: unset
// leaves the library's default (shards under a block), 1 transforms every float sum.
TEST(ConfigTest, HadamardInOptiReduceMode) {
  EXPECT_EQ(HadamardFor(Parse({})->hadamard), AllreduceOptions::Hadamard::kDefault);
  EXPECT_EQ(HadamardFor(Parse({{"OPTIREDUCE_HADAMARD", "1"}})->hadamard),
            AllreduceOptions::Hadamard::kAuto);
  EXPECT_EQ(HadamardFor(Parse({{"OPTIREDUCE_HADAMARD", "off"}})->hadamard),
            AllreduceOptions::Hadamard::kOff);
}

TEST(ConfigTest, Layout) {
  EXPECT_EQ(Parse({})->layout.layout, LayoutSetting::kAuto);
  EXPECT_EQ(Parse({{"OPTIREDUCE_LAYOUT", "flat"}})->layout.layout, LayoutSetting::kFlat);
  EXPECT_EQ(Parse({{"OPTIREDUCE_LAYOUT", " AUTO "}})->layout.layout, LayoutSetting::kAuto);
  const absl::StatusOr<Config> two = Parse({{"OPTIREDUCE_LAYOUT", "two-level"}});
  EXPECT_EQ(two->layout.layout, LayoutSetting::kTwoLevel);
  EXPECT_EQ(two->layout.group_size, 0);
  const absl::StatusOr<Config> eight = Parse({{"OPTIREDUCE_LAYOUT", "Two-Level:8"}});
  EXPECT_EQ(eight->layout.layout, LayoutSetting::kTwoLevel);
  EXPECT_EQ(eight->layout.group_size, 8);
  for (const char* bad : {"2d", "two-level:1", "two-level:", "two-level:-4", "two-level:8x",
                          "two-level8", "flat:2"}) {
    EXPECT_THAT(ErrorOf({{"OPTIREDUCE_LAYOUT", bad}}),
                AllOf(HasSubstr("OPTIREDUCE_LAYOUT='"), HasSubstr(bad), HasSubstr("two-level:G")))
        << bad;
  }
}

TEST(ConfigTest, TimeoutAndItsAlias) {
  EXPECT_EQ(Parse({{"OPTIREDUCE_TIMEOUT_MS", "250"}})->timeout.count(), 250);
  EXPECT_EQ(Parse({{"GLOO_DPDK_TIMEOUT", "40"}})->timeout.count(), 40);
  EXPECT_EQ(Parse({{"OPTIREDUCE_TIMEOUT_MS", "40"}, {"GLOO_DPDK_TIMEOUT", "40"}})->timeout.count(),
            40);
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_TIMEOUT_MS", "40"}, {"GLOO_DPDK_TIMEOUT", "50"}}),
              AllOf(HasSubstr("OPTIREDUCE_TIMEOUT_MS='40'"), HasSubstr("GLOO_DPDK_TIMEOUT='50'"),
                    HasSubstr("disagree")));
  for (const char* bad : {"-1", "abc", "1.5", "+3", "99999999999999"}) {
    EXPECT_THAT(ErrorOf({{"OPTIREDUCE_TIMEOUT_MS", bad}}),
                AllOf(HasSubstr("OPTIREDUCE_TIMEOUT_MS"), HasSubstr(bad), HasSubstr("integer")))
        << bad;
  }
  // The error names the alias when that is what the user set.
  EXPECT_THAT(ErrorOf({{"GLOO_DPDK_TIMEOUT", "soon"}}), HasSubstr("GLOO_DPDK_TIMEOUT='soon'"));
}

TEST(ConfigTest, DpdkTxSwitches) {
  // Read by the DPDK transport itself; validated and documented here, not "ignored".
  EXPECT_FALSE(Parse({})->dpdk_tx_copy);
  EXPECT_EQ(Parse({})->dpdk_tx_backlog, 2048u);
  EXPECT_TRUE(Parse({{"OPTIREDUCE_DPDK_TX_COPY", "1"}})->dpdk_tx_copy);
  EXPECT_EQ(Parse({{"OPTIREDUCE_DPDK_TX_BACKLOG", "64"}})->dpdk_tx_backlog, 64u);
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_DPDK_TX_COPY", "maybe"}}),
              HasSubstr("OPTIREDUCE_DPDK_TX_COPY='maybe'"));
  for (const char* bad : {"16", "4096", "lots"}) {
    EXPECT_THAT(ErrorOf({{"OPTIREDUCE_DPDK_TX_BACKLOG", bad}}),
                AllOf(HasSubstr("OPTIREDUCE_DPDK_TX_BACKLOG"), HasSubstr("[32, 2048]")))
        << bad;
  }
  EXPECT_THAT(UnknownOptiReduceNames({"OPTIREDUCE_DPDK_TX_COPY", "OPTIREDUCE_DPDK_TX_BACKLOG"}),
              ::testing::IsEmpty());
}

TEST(ConfigTest, MaxLoss) {
  EXPECT_DOUBLE_EQ(Parse({{"OPTIREDUCE_MAX_LOSS", "0.01"}})->max_loss, 0.01);
  EXPECT_DOUBLE_EQ(Parse({{"OPTIREDUCE_MAX_LOSS", "0"}})->max_loss, 0.0);
  for (const char* bad : {"1.5", "-0.1", "nan", "lots"}) {
    EXPECT_THAT(ErrorOf({{"OPTIREDUCE_MAX_LOSS", bad}}),
                AllOf(HasSubstr("OPTIREDUCE_MAX_LOSS"), HasSubstr("[0, 1]")))
        << bad;
  }
}

TEST(ConfigTest, PeerDeadMs) {
  EXPECT_EQ(Parse({})->peer_dead_ms, 0u);  // no silence bound: the op timeout decides
  EXPECT_EQ(Parse({{"OPTIREDUCE_PEER_DEAD_MS", "0"}})->peer_dead_ms, 0u);
  EXPECT_EQ(Parse({{"OPTIREDUCE_PEER_DEAD_MS", "250"}})->peer_dead_ms, 250u);
  for (const char* bad : {"5", "9", "-1", "soon", "3600001"}) {
    EXPECT_THAT(ErrorOf({{"OPTIREDUCE_PEER_DEAD_MS", bad}}),
                AllOf(HasSubstr("OPTIREDUCE_PEER_DEAD_MS"), HasSubstr("[10, 3600000]")))
        << bad;
  }
}

TEST(ConfigTest, RepairBudget) {
  EXPECT_DOUBLE_EQ(Parse({})->repair_budget, 1.0);
  EXPECT_DOUBLE_EQ(Parse({{"OPTIREDUCE_REPAIR_BUDGET", "0.25"}})->repair_budget, 0.25);
  EXPECT_DOUBLE_EQ(Parse({{"OPTIREDUCE_REPAIR_BUDGET", " 0 "}})->repair_budget, 0.0);
  for (const char* bad : {"-0.5", "11", "inf", "nan", "half"}) {
    EXPECT_THAT(ErrorOf({{"OPTIREDUCE_REPAIR_BUDGET", bad}}),
                AllOf(HasSubstr("OPTIREDUCE_REPAIR_BUDGET"), HasSubstr("[0, 10]")))
        << bad;
  }
}

TEST(ConfigTest, StartGrace) {
  EXPECT_TRUE(Parse({})->learn_start_grace) << "stragglers are left out by default";
  EXPECT_TRUE(Parse({{"OPTIREDUCE_START_GRACE", "learned"}})->learn_start_grace);
  EXPECT_TRUE(Parse({{"OPTIREDUCE_START_GRACE", " Learned "}})->learn_start_grace);
  EXPECT_FALSE(Parse({{"OPTIREDUCE_START_GRACE", "budget"}})->learn_start_grace);
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_START_GRACE", "adaptive"}}),
              AllOf(HasSubstr("OPTIREDUCE_START_GRACE='adaptive'"), HasSubstr("budget, learned")));
}

TEST(ConfigTest, UdpSettings) {
  absl::StatusOr<Config> c = Parse({{"OPTIREDUCE_UDP_HOST", "10.0.0.7"},
                                    {"OPTIREDUCE_UDP_PORT_BASE", "40000"},
                                    {"OPTIREDUCE_UDP_PORT_RANGE", "8"},
                                    {"OPTIREDUCE_UDP_MAX_DATAGRAM", "1472"},
                                    {"OPTIREDUCE_UDP_OFFLOAD", "off"},
                                    {"OPTIREDUCE_SOCKET_BUFFER_BYTES", "4194304"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->udp_host, "10.0.0.7");
  EXPECT_EQ(c->udp_port_base, 40000);
  EXPECT_EQ(c->udp_port_range, 8);
  EXPECT_EQ(c->udp_max_datagram, 1472u);
  EXPECT_EQ(c->socket_buffer_bytes, 4194304u);
  EXPECT_FALSE(c->udp_offload);
  EXPECT_TRUE(Parse({})->udp_offload);
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_UDP_OFFLOAD", "maybe"}}),
              AllOf(HasSubstr("OPTIREDUCE_UDP_OFFLOAD='maybe'"), HasSubstr("on, off")));
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_UDP_PORT_BASE", "70000"}}),
              AllOf(HasSubstr("OPTIREDUCE_UDP_PORT_BASE='70000'"), HasSubstr("[0, 65535]")));
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_UDP_MAX_DATAGRAM", "100"}}),
              HasSubstr("OPTIREDUCE_UDP_MAX_DATAGRAM='100'"));
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_UDP_HOST", "a b"}}), HasSubstr("OPTIREDUCE_UDP_HOST"));
}

TEST(ConfigTest, DpdkSettingsAndAliases) {
  absl::StatusOr<Config> c = Parse({{"GLOO_DPDK_EAL_ARGS", "--no-huge -m 256"},
                                    {"OPTIREDUCE_DPDK_PORTS", "net_memif0, 1"},
                                    {"OPTIREDUCE_DPDK_IPV4", "10.1.2.3"},
                                    {"OPTIREDUCE_DPDK_UDP_PORT", "17001"},
                                    {"OPTIREDUCE_DPDK_MTU", "9000"},
                                    {"GLOO_DPDK_FILE_PREFIX", "job7"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eal_args, "--no-huge -m 256");
  EXPECT_THAT(c->dpdk_ports, ElementsAre("net_memif0", "1"));
  EXPECT_EQ(c->dpdk_ipv4, "10.1.2.3");
  EXPECT_EQ(c->dpdk_udp_port, 17001);
  EXPECT_EQ(c->dpdk_mtu, 9000u);
  EXPECT_EQ(c->dpdk_file_prefix, "job7");
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_DPDK_PORTS", "a,,b"}}),
              HasSubstr("OPTIREDUCE_DPDK_PORTS='a,,b'"));
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_DPDK_IPV4", "10.1.2"}}),
              HasSubstr("OPTIREDUCE_DPDK_IPV4='10.1.2'"));
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_DPDK_MTU", "100"}}), HasSubstr("OPTIREDUCE_DPDK_MTU='100'"));
  EXPECT_THAT(ErrorOf({{"GLOO_DPDK_FILE_PREFIX", "a b"}}), HasSubstr("GLOO_DPDK_FILE_PREFIX"));
}

TEST(ConfigTest, FaultsAreValidated) {
  EXPECT_EQ(Parse({{"OPTIREDUCE_FAULTS", "drop=0.01,seed=3"}})->faults, "drop=0.01,seed=3");
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_FAULTS", "drop=2"}}),
              AllOf(HasSubstr("OPTIREDUCE_FAULTS='drop=2'"), HasSubstr("allowed")));
  EXPECT_THAT(ErrorOf({{"OPTIREDUCE_FAULTS", "lose=0.1"}}), HasSubstr("OPTIREDUCE_FAULTS"));
}

TEST(ConfigTest, RedisUrlIsValidatedWithoutPrintingThePassword) {
  EXPECT_TRUE(Parse({{"OPTIREDUCE_REDIS_URL", "redis://:pw@127.0.0.1:6379"}}).ok());
  const std::string error = ErrorOf({{"OPTIREDUCE_REDIS_URL", "http://:hunter2@host"}});
  EXPECT_THAT(error, HasSubstr("OPTIREDUCE_REDIS_URL"));
  EXPECT_THAT(error, ::testing::Not(HasSubstr("hunter2")));
  absl::StatusOr<Config> c = Parse({{"OPTIREDUCE_REDIS_URL", "redis://:hunter2@h:1"}});
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->sources, ElementsAre("OPTIREDUCE_REDIS_URL=<redacted>"));
}

TEST(ConfigTest, SourcesRecordWhatWasRead) {
  absl::StatusOr<Config> c = Parse({{"GLOO_ALGO", "transpose"}, {"GLOO_DPDK_TIMEOUT", "9"}});
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->sources, ElementsAre("GLOO_ALGO=transpose", "GLOO_DPDK_TIMEOUT=9"));
}

TEST(ConfigTest, UnknownOptiReduceNames) {
  EXPECT_THAT(UnknownOptiReduceNames({"PATH", "OPTIREDUCE_FAULTS", "OPTIREDUCE_HADAMRD",
                                      "OPTIREDUCE_TEST_CASES", "OPTIREDUCE_BENCH_STATS",
                                      "GLOO_ALGO", "OPTIREDUCE_BUILD_DIR", "OPTIREDUCE_X"}),
              ElementsAre("OPTIREDUCE_HADAMRD", "OPTIREDUCE_X"));
  // No module reads an OPTIREDUCE_TRACE_ name: it is a typo like any other.
  EXPECT_THAT(UnknownOptiReduceNames({"OPTIREDUCE_TRACE_ACKS"}),
              ElementsAre("OPTIREDUCE_TRACE_ACKS"));
  // Every documented variable is known.
  std::vector<std::string> documented;
  for (const VariableDoc& doc : DocumentedVariables()) documented.push_back(doc.name);
  EXPECT_TRUE(UnknownOptiReduceNames(documented).empty());
}

}  // namespace
}  // namespace gloo_ext
}  // namespace optireduce
