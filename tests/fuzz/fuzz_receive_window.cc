// Fuzz target: transport::ReceiveWindow, the reliable service's record of which sequence
// numbers of a peer arrived (cumulative point + selective-ack bitmap) — what acknowledgements
// and duplicate suppression are built from, fed by arbitrary packet arrival orders.
//
// Input: a stream of 2-byte steps, each a sequence number relative to the window's
// cumulative point (-256 .. +10239, so duplicates below it, the whole window and beyond
// it are all reached). Checked against a plain model (the set of marked numbers): every
// verdict, the cumulative point after every Mark, and after every step the SACK bitmap at
// a size the step picks (bit i <-> cum+1+i, truncated to the buffer, zero past the
// highest number marked).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "transport_dpdk/reliable/receive_window.h"

using optireduce::transport::ReceiveWindow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ReceiveWindow w;
  std::set<uint64_t> marked;  // the model
  uint64_t cum = 0, highest = 0;
  uint8_t sack[ReceiveWindow::kSpan / 8 + 16];
  for (size_t i = 0; i + 1 < size; i += 2) {
    const uint16_t step = static_cast<uint16_t>(data[i] | (data[i + 1] << 8));
    const int64_t rel = static_cast<int64_t>(step % 10496) - 256;
    if (rel < 0 && cum < static_cast<uint64_t>(-rel)) continue;
    const uint64_t seq = cum + rel;

    const ReceiveWindow::Verdict want =
        seq < cum || marked.count(seq) ? ReceiveWindow::Verdict::kDuplicate
        : seq >= cum + ReceiveWindow::kSpan ? ReceiveWindow::Verdict::kOutOfWindow
                                           : ReceiveWindow::Verdict::kNew;
    const ReceiveWindow::Verdict got = w.Classify(seq);
    FUZZ_CHECK(got == want, "seq %llu cum %llu: verdict %d, model %d",
               (unsigned long long)seq, (unsigned long long)cum, int(got), int(want));
    if (got == ReceiveWindow::Verdict::kNew) {
      w.Mark(seq);
      marked.insert(seq);
      if (seq + 1 > highest) highest = seq + 1;
      while (marked.count(cum)) marked.erase(cum++);
    }
    FUZZ_CHECK(w.cum() == cum, "cum %llu, model %llu", (unsigned long long)w.cum(),
               (unsigned long long)cum);

    // The SACK bitmap, at a buffer size this step picks (0 .. the full window).
    const size_t max_bytes = (step * 7u) % (sizeof(sack) - 16 + 1);
    std::memset(sack, 0xA5, sizeof(sack));
    const size_t n = w.Sack(sack, max_bytes);
    FUZZ_CHECK(n <= max_bytes, "%zu bytes written into %zu", n, max_bytes);
    const uint64_t span = highest > cum + 1 ? highest - (cum + 1) : 0;
    const size_t want_n = std::min<size_t>((span + 7) / 8, max_bytes);
    FUZZ_CHECK(n == want_n, "sack of %zu bytes, model %zu", n, want_n);
    std::vector<uint8_t> model(n, 0);  // every marked number is above cum (cum is not)
    for (uint64_t s : marked) {
      const uint64_t b = s - (cum + 1);
      if (b < n * 8) model[b / 8] |= static_cast<uint8_t>(1u << (b % 8));
    }
    for (size_t b = 0; b < n; ++b) {
      FUZZ_CHECK(sack[b] == model[b], "sack byte %zu (seqs from %llu): %02x, model %02x", b,
                 (unsigned long long)(cum + 1 + 8 * b), sack[b], model[b]);
    }
    FUZZ_CHECK(sack[n] == 0xA5 || n == max_bytes, "byte past the sack overwritten");
  }
  return 0;
}
