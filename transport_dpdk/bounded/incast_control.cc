#include "transport_dpdk/bounded/incast_control.h"

#include <algorithm>

namespace optireduce {
namespace transport {

IncastControl::IncastControl(int max_senders, int initial)
    : max_(std::max(1, max_senders)), senders_(std::clamp(initial, 1, max_)) {}

int IncastControl::senders() const {
  std::lock_guard<std::mutex> lock(mu_);
  return senders_;
}

int IncastControl::OnOperation(double loss_fraction, bool late) {
  std::lock_guard<std::mutex> lock(mu_);
  if (loss_fraction > 0) {
    // Loss may also be the network's own (not incast): halving to one sender costs
    // little, TAR's staggered order already spreads the load.
    senders_ = std::max(1, senders_ / 2);
    clean_ops_ = 0;
  } else if (late) {
    // Queues building up before they overflow: back off gently.
    senders_ = std::max(1, senders_ - 1);
    clean_ops_ = 0;
  } else if (++clean_ops_ >= kCleanOpsToGrow) {
    senders_ = std::min(max_, senders_ + 1);
    clean_ops_ = 0;
  }
  return senders_;
}

}  // namespace transport
}  // namespace optireduce
