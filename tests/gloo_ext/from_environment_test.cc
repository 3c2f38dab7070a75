// The environment reaches the transport and rendezvous only through gloo_ext: the attr
// helpers of gloo_ext/devices.h and gloo_ext/redis_options.h map each variable to its
// field, and the *FromEnvironment() forms see the environment as it is at the call.
#include <stdlib.h>

#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gloo_ext/config.h"
#include "gloo_ext/devices.h"
#include "gloo_ext/redis_options.h"

namespace optireduce {
namespace gloo_ext {
namespace {

using ::testing::HasSubstr;

Config Parsed(std::map<std::string, std::string> env) {
  absl::StatusOr<Config> c = ParseConfig([env](absl::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Config();
}

TEST(FromEnvironmentTest, DefaultsAreTheTransportsDefaults) {
  const Config none = Parsed({});
  const transport::udp::attr udp = UdpAttrOf(none);
  const transport::udp::attr udp_default;
  EXPECT_EQ(udp.hostname, udp_default.hostname);
  EXPECT_EQ(udp.port, udp_default.port);
  EXPECT_EQ(udp.max_datagram, udp_default.max_datagram);
  EXPECT_EQ(udp.socket_buffer_bytes, udp_default.socket_buffer_bytes);
  EXPECT_EQ(udp.segmentation_offload, udp_default.segmentation_offload);
  const transport::EngineOptions engine = EngineOptionsOf(none);
  EXPECT_EQ(engine.faults, "");
  EXPECT_EQ(engine.session_token, 0u);
  EXPECT_EQ(engine.peer_dead, transport::EngineOptions().peer_dead);
  const transport::dpdk::attr dpdk = DpdkAttrOf(none);
  const transport::dpdk::attr dpdk_default;
  EXPECT_EQ(dpdk.eal_args, "");
  EXPECT_TRUE(dpdk.ports.empty());
  EXPECT_EQ(dpdk.mtu, dpdk_default.mtu);
  EXPECT_EQ(dpdk.tx_copy_bodies, dpdk_default.tx_copy_bodies);
  EXPECT_EQ(dpdk.tx_backlog, dpdk_default.tx_backlog);
}

TEST(FromEnvironmentTest, EveryVariableReachesItsField) {
  const Config c = Parsed({{"OPTIREDUCE_FAULTS", "drop=0.01,seed=3"},
                           {"OPTIREDUCE_SESSION_TOKEN", "42"},
                           {"OPTIREDUCE_UDP_HOST", "10.0.0.7"},
                           {"OPTIREDUCE_UDP_PORT_BASE", "17100"},
                           {"OPTIREDUCE_UDP_MAX_DATAGRAM", "1400"},
                           {"OPTIREDUCE_UDP_OFFLOAD", "off"},
                           {"OPTIREDUCE_SOCKET_BUFFER_BYTES", "1048576"},
                           {"GLOO_DPDK_EAL_ARGS", "--no-huge -m 256"},
                           {"OPTIREDUCE_DPDK_PORTS", "net_memif0,1"},
                           {"OPTIREDUCE_DPDK_IPV4", "10.1.2.3"},
                           {"OPTIREDUCE_DPDK_UDP_PORT", "17001"},
                           {"OPTIREDUCE_DPDK_MTU", "9000"},
                           {"OPTIREDUCE_DPDK_TX_COPY", "yes"},
                           {"OPTIREDUCE_DPDK_TX_BACKLOG", "64"}});
  const transport::udp::attr udp = UdpAttrOf(c);
  EXPECT_EQ(udp.hostname, "10.0.0.7");
  EXPECT_EQ(udp.port, 17100);
  EXPECT_EQ(udp.max_datagram, 1400u);
  EXPECT_FALSE(udp.segmentation_offload);
  EXPECT_EQ(udp.socket_buffer_bytes, 1048576u);
  const transport::EngineOptions engine = EngineOptionsOf(c);
  EXPECT_EQ(engine.faults, "drop=0.01,seed=3");
  EXPECT_EQ(engine.session_token, 42u);
  const transport::dpdk::attr dpdk = DpdkAttrOf(c);
  EXPECT_EQ(dpdk.eal_args, "--no-huge -m 256");  // the alias works for C++ devices too
  EXPECT_EQ(dpdk.ports, (std::vector<std::string>{"net_memif0", "1"}));
  EXPECT_EQ(dpdk.ipv4, "10.1.2.3");
  EXPECT_EQ(dpdk.udp_port, 17001);
  EXPECT_EQ(dpdk.mtu, 9000u);
  EXPECT_TRUE(dpdk.tx_copy_bodies);
  EXPECT_EQ(dpdk.tx_backlog, 64u);
}

TEST(FromEnvironmentTest, FilePrefixIsAppendedToTheEalArguments) {
  EXPECT_THAT(DpdkAttrOf(Parsed({{"OPTIREDUCE_EAL_ARGS", "--no-huge"},
                                 {"GLOO_DPDK_FILE_PREFIX", "job7"}}))
                  .eal_args,
              "--no-huge --file-prefix=job7");
}

TEST(FromEnvironmentTest, RedisOptionsNameTheMissingVariable) {
  absl::StatusOr<rendezvous::RedisOptions> missing = RedisOptionsOf(Parsed({}), "job", 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("OPTIREDUCE_REDIS_URL is not set"));
  absl::StatusOr<rendezvous::RedisOptions> o = RedisOptionsOf(
      Parsed({{"OPTIREDUCE_REDIS_URL", "redis://h:1"}, {"OPTIREDUCE_RUN_ID", "r9"}}), "job", 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->url, "redis://h:1");
  EXPECT_EQ(o->run_id, "r9");
  EXPECT_EQ(o->job_id, "job");
  EXPECT_EQ(o->world_size, 2);
}

TEST(FromEnvironmentTest, TheEnvironmentIsReadAtEachCall) {
  ::unsetenv("OPTIREDUCE_FAULTS");
  ASSERT_TRUE(EngineOptionsFromEnvironment().ok());
  EXPECT_EQ(EngineOptionsFromEnvironment()->faults, "");
  ::setenv("OPTIREDUCE_FAULTS", "drop=0.5,seed=1", 1);
  EXPECT_EQ(EngineOptionsFromEnvironment()->faults, "drop=0.5,seed=1");
  ASSERT_TRUE(UdpAttrFromEnvironment().ok());
  EXPECT_EQ(ReadEnvironment("OPTIREDUCE_FAULTS"), "drop=0.5,seed=1");
  // A bad value fails every helper with the parser's message.
  ::setenv("OPTIREDUCE_FAULTS", "drop=2", 1);
  absl::StatusOr<transport::dpdk::attr> bad = DpdkAttrFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("OPTIREDUCE_FAULTS='drop=2' is not valid"));
  ::unsetenv("OPTIREDUCE_FAULTS");
  EXPECT_FALSE(ReadEnvironment("OPTIREDUCE_FAULTS").has_value());
}

}  // namespace
}  // namespace gloo_ext
}  // namespace optireduce
