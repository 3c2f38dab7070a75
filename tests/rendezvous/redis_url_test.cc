#include "rendezvous/redis_url.h"

#include <gtest/gtest.h>

namespace optireduce {
namespace rendezvous {
namespace {

TEST(RedisUrlTest, HostOnlyGetsDefaults) {
  auto u = ParseRedisUrl("redis://example.org");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "example.org");
  EXPECT_EQ(u->port, 6379);
  EXPECT_EQ(u->db, 0);
  EXPECT_EQ(u->user, "");
  EXPECT_EQ(u->password, "");
}

TEST(RedisUrlTest, FullForm) {
  auto u = ParseRedisUrl("redis://alice:pw@10.0.0.5:7000/3");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "pw");
  EXPECT_EQ(u->host, "10.0.0.5");
  EXPECT_EQ(u->port, 7000);
  EXPECT_EQ(u->db, 3);
  EXPECT_EQ(u->Endpoint(), "10.0.0.5:7000/3");
}

TEST(RedisUrlTest, PasswordOnlyForms) {
  auto a = ParseRedisUrl("redis://:pw@h:1");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->user, "");
  EXPECT_EQ(a->password, "pw");
  auto b = ParseRedisUrl("redis://pw@h");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->user, "");
  EXPECT_EQ(b->password, "pw");
}

TEST(RedisUrlTest, PercentEncodedAndAtInPassword) {
  auto u = ParseRedisUrl("redis://bob:p%3Aw%2Fd%40x@h:2/0");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->password, "p:w/d@x");
  auto v = ParseRedisUrl("redis://bob:p@ss@h:2");  // last '@' ends the credentials
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->password, "p@ss");
  EXPECT_EQ(v->host, "h");
}

TEST(RedisUrlTest, Ipv6Literal) {
  auto u = ParseRedisUrl("redis://[::1]:6380/1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 1);
}

TEST(RedisUrlTest, SchemeIsCaseInsensitive) {
  EXPECT_TRUE(ParseRedisUrl("REDIS://h:1").ok());
}

// Each bad URL must fail with InvalidArgument naming the part that is wrong.
struct BadUrl {
  const char* url;
  const char* names;
};

class RedisUrlBadTest : public ::testing::TestWithParam<BadUrl> {};

TEST_P(RedisUrlBadTest, RejectedNamingThePart) {
  auto u = ParseRedisUrl(GetParam().url);
  ASSERT_FALSE(u.ok()) << GetParam().url;
  EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(u.status().message().find(GetParam().names), std::string::npos)
      << u.status();
}

INSTANTIATE_TEST_SUITE_P(
    All, RedisUrlBadTest,
    ::testing::Values(BadUrl{"", "scheme"}, BadUrl{"http://h:1", "scheme"},
                      BadUrl{"h:6379", "scheme"}, BadUrl{"redis://", "host"},
                      BadUrl{"redis://:6379", "host"}, BadUrl{"redis://pw@:1", "host"},
                      BadUrl{"redis://h:", "port"}, BadUrl{"redis://h:abc", "port"},
                      BadUrl{"redis://h:0", "port"}, BadUrl{"redis://h:65536", "port"},
                      BadUrl{"redis://h:-1", "port"}, BadUrl{"redis://h:+5", "port"},
                      BadUrl{"redis://h:1/x", "db"}, BadUrl{"redis://h:1/-1", "db"},
                      BadUrl{"redis://h:1/1/2", "db"}, BadUrl{"redis://h o:1", "host"},
                      BadUrl{"redis://[::1:1", "host"}, BadUrl{"redis://[::1]x", "host"},
                      BadUrl{"redis://u:p%zz@h", "password"}, BadUrl{"redis://u%4:p@h", "user"},
                      BadUrl{"redis://u%:p@h", "user"}, BadUrl{"redis://alice:@h", "password"}));

TEST(RedisUrlTest, PasswordNeverInErrors) {
  auto u = ParseRedisUrl("redis://u:topsecret@h:notaport");
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().message().find("topsecret"), std::string::npos) << u.status();
}

}  // namespace
}  // namespace rendezvous
}  // namespace optireduce
