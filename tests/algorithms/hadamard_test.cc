#include "algorithms/hadamard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace optireduce {
namespace hadamard {
namespace {

template <typename T>
std::vector<T> RandomVector(size_t n, uint64_t rng_seed) {
  std::mt19937_64 rng(rng_seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(normal(rng));
  return v;
}

template <typename T>
double L2(const std::vector<T>& v) {
  double s = 0;
  for (T x : v) s += double(x) * double(x);
  return std::sqrt(s);
}

// ||a - b||_2 / ||b||_2 (0 for empty vectors): float keeps ~1e-7 relative per element, and a
// transform of depth log2_block adds a few roundings, so 1e-6 is tight but safe for float.
template <typename T>
double RelL2(const std::vector<T>& a, const std::vector<T>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    s += double(b[i]) * double(b[i]);
  }
  return s == 0 ? std::sqrt(d) : std::sqrt(d / s);
}

// max |a - b| / max |b|.
template <typename T>
double RelMax(const std::vector<T>& a, const std::vector<T>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return m == 0 ? d : d / m;
}

std::vector<Kernel> SupportedKernels() {
  std::vector<Kernel> out;
  for (Kernel k : {Kernel::kScalar, Kernel::kAvx2, Kernel::kAvx512}) {
    if (KernelSupported(k)) out.push_back(k);
  }
  return out;
}

Options MakeOptions(int log2_block, Kernel kernel) {
  Options o;
  o.log2_block = log2_block;
  o.kernel = kernel;
  return o;
}

const std::vector<size_t> kLengths = {0,    1,    2,     3,     7,     16,     17,    255,
                                      1024, 1025, 4097,  12345, 65537, 100003, 262144};
const std::vector<int> kLog2Blocks = {1, 3, 4, 5, 8, 12, 14, 16};

TEST(HadamardTest, RoundTripFloat) {
  for (Kernel kernel : SupportedKernels()) {
    for (int lb : kLog2Blocks) {
      for (size_t n : kLengths) {
        SCOPED_TRACE(std::string(KernelName(kernel)) + " log2_block=" + std::to_string(lb) +
                     " n=" + std::to_string(n));
        const auto x = RandomVector<float>(n, n * 31 + lb);
        auto y = x;
        const Options o = MakeOptions(lb, kernel);
        Forward(y.data(), n, 42, o);
        if (n >= 16) {
          EXPECT_GT(RelL2(y, x), 0.1) << "forward did not change the data";
        }
        Inverse(y.data(), n, 42, o);
        EXPECT_LE(RelL2(y, x), 1e-6);
        EXPECT_LE(RelMax(y, x), 1e-6);
      }
    }
  }
}

TEST(HadamardTest, RoundTripTenMillionFloats) {
  const size_t n = 10'000'000;  // not a multiple of any block: exercises a long tail
  const auto x = RandomVector<float>(n, 7);
  for (Kernel kernel : SupportedKernels()) {
    SCOPED_TRACE(KernelName(kernel));
    auto y = x;
    const Options o = MakeOptions(kDefaultLog2Block, kernel);
    Forward(y.data(), n, 99, o);
    Inverse(y.data(), n, 99, o);
    EXPECT_LE(RelL2(y, x), 1e-6);
    EXPECT_LE(RelMax(y, x), 1e-6);
  }
}

// Block by block (in any order) is exactly Inverse, bit for bit, for every layout.
TEST(HadamardTest, InverseBlockByBlockIsInverse) {
  for (Kernel kernel : SupportedKernels()) {
    for (size_t n : kLengths) {
      for (int log2_block : {3, 8, 12}) {
        const Options o = MakeOptions(log2_block, kernel);
        auto whole = RandomVector<float>(n, n + 7);
        auto blocks = whole;
        Inverse(whole.data(), n, 42, o);
        std::vector<Block> layout = Blocks(n, o);
        size_t covered = 0;
        for (const Block& b : layout) covered += size_t{1} << b.log2_size;
        ASSERT_EQ(covered, n);
        for (size_t i = layout.size(); i-- > 0;) InverseBlock(blocks.data(), layout[i], 42, o);
        // (memcmp, not ==: bit for bit; n == 0 has no data pointer to compare.)
        ASSERT_TRUE(n == 0 || std::memcmp(whole.data(), blocks.data(), n * sizeof(float)) == 0)
            << KernelName(kernel) << " n=" << n << " log2_block=" << log2_block;
        auto whole_d = RandomVector<double>(n, n + 9);
        auto blocks_d = whole_d;
        Inverse(whole_d.data(), n, 7, o);
        for (const Block& b : layout) InverseBlock(blocks_d.data(), b, 7, o);
        ASSERT_TRUE(n == 0 ||
                    std::memcmp(whole_d.data(), blocks_d.data(), n * sizeof(double)) == 0);
      }
    }
  }
  std::vector<float> v(64);
  EXPECT_THROW(InverseBlock(v.data(), Block{3, 2}, 1), std::invalid_argument);  // misaligned
  EXPECT_THROW(Blocks(64, MakeOptions(0, Kernel::kScalar)), std::invalid_argument);
}

TEST(HadamardTest, RoundTripDouble) {
  for (Kernel kernel : SupportedKernels()) {
    for (int lb : kLog2Blocks) {
      for (size_t n : kLengths) {
        SCOPED_TRACE(std::string(KernelName(kernel)) + " log2_block=" + std::to_string(lb) +
                     " n=" + std::to_string(n));
        const auto x = RandomVector<double>(n, n * 17 + lb);
        auto y = x;
        const Options o = MakeOptions(lb, kernel);
        Forward(y.data(), n, 5, o);
        Inverse(y.data(), n, 5, o);
        EXPECT_LE(RelL2(y, x), 1e-13);
        EXPECT_LE(RelMax(y, x), 1e-13);
      }
    }
  }
}

// Forward of a unit vector e_j is d_j * H[:, j]: every entry is ±1/sqrt(n), and the sign
// pattern relative to entry 0 is (-1)^popcount(i & j). This pins down the actual Walsh-
// Hadamard matrix (not just some orthogonal map).
TEST(HadamardTest, MatchesHadamardMatrixDefinition) {
  const int lb = 8;
  const size_t n = size_t{1} << lb;
  for (Kernel kernel : SupportedKernels()) {
    for (size_t j : {size_t{0}, size_t{1}, size_t{5}, size_t{100}, n - 1}) {
      SCOPED_TRACE(std::string(KernelName(kernel)) + " j=" + std::to_string(j));
      std::vector<double> e(n, 0.0);
      e[j] = 1.0;
      Forward(e.data(), n, 1234, MakeOptions(lb, kernel));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(std::fabs(e[i]) * std::sqrt(double(n)), 1.0, 1e-12) << "i=" << i;
        const double expected = (__builtin_popcountll(i & j) & 1) ? -1.0 : 1.0;
        ASSERT_NEAR(e[i] * e[0] * double(n), expected, 1e-12) << "i=" << i;
      }
    }
  }
}

TEST(HadamardTest, Linearity) {
  for (Kernel kernel : SupportedKernels()) {
    for (size_t n : {size_t{1000}, size_t{65536}, size_t{100003}}) {
      SCOPED_TRACE(std::string(KernelName(kernel)) + " n=" + std::to_string(n));
      auto a = RandomVector<float>(n, 1);
      auto b = RandomVector<float>(n, 2);
      std::vector<float> sum(n);
      for (size_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
      const Options o = MakeOptions(kDefaultLog2Block, kernel);
      Forward(a.data(), n, 77, o);
      Forward(b.data(), n, 77, o);
      Forward(sum.data(), n, 77, o);
      std::vector<float> summed(n);
      for (size_t i = 0; i < n; ++i) summed[i] = a[i] + b[i];
      EXPECT_LE(RelL2(summed, sum), 1e-6);
      // And the reduce-in-transformed-domain contract: inverse of the sum is the sum.
      Inverse(summed.data(), n, 77, o);
      auto a0 = RandomVector<float>(n, 1);
      auto b0 = RandomVector<float>(n, 2);
      std::vector<float> expected(n);
      for (size_t i = 0; i < n; ++i) expected[i] = a0[i] + b0[i];
      EXPECT_LE(RelL2(summed, expected), 1e-6);
    }
  }
}

TEST(HadamardTest, PreservesEnergy) {
  for (Kernel kernel : SupportedKernels()) {
    for (int lb : {1, 8, 14}) {
      for (size_t n : {size_t{7}, size_t{4096}, size_t{100003}}) {
        SCOPED_TRACE(std::string(KernelName(kernel)) + " log2_block=" + std::to_string(lb) +
                     " n=" + std::to_string(n));
        auto x = RandomVector<float>(n, 3);
        const double before = L2(x);
        Forward(x.data(), n, 11, MakeOptions(lb, kernel));
        EXPECT_NEAR(L2(x), before, 1e-6 * before);
        auto d = RandomVector<double>(n, 3);
        const double before_d = L2(d);
        Forward(d.data(), n, 11, MakeOptions(lb, kernel));
        EXPECT_NEAR(L2(d), before_d, 1e-13 * before_d);
      }
    }
  }
}

template <typename T>
void ExpectKernelMatchesScalar(Kernel kernel, double tolerance) {
  for (int lb : {1, 2, 3, 4, 5, 6, 8, 11, 12, 13, 14, 16, 18}) {
    for (size_t n : kLengths) {
      SCOPED_TRACE(std::string(KernelName(kernel)) + " log2_block=" + std::to_string(lb) +
                   " n=" + std::to_string(n));
      const auto x = RandomVector<T>(n, n + lb);
      auto reference = x;
      auto simd = x;
      Forward(reference.data(), n, 2024, MakeOptions(lb, Kernel::kScalar));
      Forward(simd.data(), n, 2024, MakeOptions(lb, kernel));
      // All kernels do the same roundings in the same order, so this is exact in practice.
      ASSERT_LE(RelMax(simd, reference), tolerance) << "forward";
      Inverse(reference.data(), n, 2024, MakeOptions(lb, Kernel::kScalar));
      Inverse(simd.data(), n, 2024, MakeOptions(lb, kernel));
      ASSERT_LE(RelMax(simd, reference), tolerance) << "inverse";
    }
  }
}

TEST(HadamardTest, Avx2MatchesScalar) {
  if (!KernelSupported(Kernel::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2+FMA";
  ExpectKernelMatchesScalar<float>(Kernel::kAvx2, 1e-7);
  ExpectKernelMatchesScalar<double>(Kernel::kAvx2, 1e-15);
}

TEST(HadamardTest, Avx512MatchesScalar) {
  if (!KernelSupported(Kernel::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512F";
  ExpectKernelMatchesScalar<float>(Kernel::kAvx512, 1e-7);
  ExpectKernelMatchesScalar<double>(Kernel::kAvx512, 1e-15);
}

TEST(HadamardTest, SeedsSelectSigns) {
  const size_t n = 4096 + 77;
  const auto x = RandomVector<float>(n, 9);
  auto a = x, b = x, c = x;
  Forward(a.data(), n, 1);
  Forward(b.data(), n, 1);
  Forward(c.data(), n, 2);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "not deterministic";
  EXPECT_GT(RelL2(a, c), 0.5) << "different seeds should give unrelated outputs";

  EXPECT_NE(OperationSeed(123, 1), OperationSeed(123, 2));
  EXPECT_NE(OperationSeed(123, 1), OperationSeed(124, 1));
  EXPECT_NE(OperationSeed(1, 2), OperationSeed(2, 1));
  EXPECT_EQ(OperationSeed(123, 1), OperationSeed(123, 1));
  // Consecutive operations give unrelated sign vectors (about half the signs differ).
  auto s1 = std::vector<float>(n, 1.0f), s2 = s1;
  Options single;
  single.log2_block = 1;  // 2-element blocks: forward of (1,1) shows the two signs directly
  Forward(s1.data(), n, OperationSeed(5, 1), single);
  Forward(s2.data(), n, OperationSeed(5, 2), single);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += (s1[i] != s2[i]);
  EXPECT_GT(differ, n / 4);
  EXPECT_LT(differ, 3 * n / 4);
}

// A dropped 1 KiB packet = 256 consecutive transformed floats. Without the transform the
// hole zeroes 256 gradient entries: max error = max |x| over them. With the transform the
// loss z (256 coefficients, same scale as x since H is orthonormal) comes back as D H z; for
// a 256-aligned run, H = H_(B/256) (x) H_256 makes that H_256 z (distributed like z) scaled by
// sqrt(256/B) and repeated with signs over the block. So the expected ratio of max errors is
// sqrt(B/256): 16x for B = 2^16 (measured ~16x; 2^15: ~11x). Assert at least 5x.
TEST(HadamardTest, LostPacketIsSpreadOverTheBlock) {
  const int lb = 16;
  const size_t block = size_t{1} << lb;
  const size_t n = 2 * block + 1000;
  for (uint64_t trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const auto x = RandomVector<float>(n, 100 + trial);
    const size_t lost_begin = block + 4096 + 256 * trial;  // inside the second block
    const size_t lost_len = 256;

    auto raw = x;
    for (size_t i = lost_begin; i < lost_begin + lost_len; ++i) raw[i] = 0.0f;

    auto y = x;
    const Options o = MakeOptions(lb, BestKernel());
    const uint64_t seed = OperationSeed(7, trial);
    Forward(y.data(), n, seed, o);
    for (size_t i = lost_begin; i < lost_begin + lost_len; ++i) y[i] = 0.0f;
    Inverse(y.data(), n, seed, o);

    double raw_err = 0, hadamard_err = 0;
    for (size_t i = 0; i < n; ++i) {
      raw_err = std::max(raw_err, std::fabs(double(raw[i]) - x[i]));
      hadamard_err = std::max(hadamard_err, std::fabs(double(y[i]) - x[i]));
    }
    EXPECT_GT(hadamard_err, 0.0);
    EXPECT_GE(raw_err / hadamard_err, 5.0)
        << "raw max error " << raw_err << ", transformed max error " << hadamard_err;
    // Other blocks are untouched by the loss.
    EXPECT_LE(RelMax(std::vector<float>(y.begin(), y.begin() + block),
                     std::vector<float>(x.begin(), x.begin() + block)),
              1e-6);
  }
}

template <typename Fn>
void ExpectInvalidArgument(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(HadamardTest, BadInputsThrow) {
  std::vector<float> x(16, 1.0f);
  std::vector<double> d(16, 1.0);
  ExpectInvalidArgument([&] { Forward(x.data(), x.size(), 1, MakeOptions(0, Kernel::kScalar)); },
                        "log2_block 0");
  ExpectInvalidArgument([&] { Inverse(x.data(), x.size(), 1, MakeOptions(30, BestKernel())); },
                        "log2_block 30");
  ExpectInvalidArgument([&] { Forward(d.data(), d.size(), 1, MakeOptions(-3, BestKernel())); },
                        "log2_block -3");
  ExpectInvalidArgument([&] { Forward(static_cast<float*>(nullptr), 5, 1); }, "nullptr");
  ExpectInvalidArgument([&] { Inverse(static_cast<double*>(nullptr), 5, 1); }, "nullptr");
  // Empty input is fine, with or without a pointer.
  EXPECT_NO_THROW(Forward(static_cast<float*>(nullptr), 0, 1));
  EXPECT_NO_THROW(Inverse(x.data(), 0, 1));
}

TEST(HadamardTest, KernelNamesAndBest) {
  EXPECT_STREQ(KernelName(Kernel::kScalar), "scalar");
  EXPECT_STREQ(KernelName(Kernel::kAvx2), "avx2");
  EXPECT_STREQ(KernelName(Kernel::kAvx512), "avx512");
  EXPECT_TRUE(KernelSupported(Kernel::kScalar));
  EXPECT_TRUE(KernelSupported(BestKernel()));
}

}  // namespace
}  // namespace hadamard
}  // namespace optireduce
