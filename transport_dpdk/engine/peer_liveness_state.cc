#include "transport_dpdk/engine/peer_liveness_state.h"

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {

void PeerLivenessState::Heard(Clock::time_point now, bool probe_answer) {
  schedule_.Heard(now, probe_answer);
  // It spoke: whoever said it was gone was wrong.
  reason_.clear();
  blame_ = -1;
}

void PeerLivenessState::Aborted(int self, int blamed) {
  if (blamed >= 0 && blamed != rank_ && blamed != self) {
    reason_ = absl::StrCat("peer rank ", blamed, " is gone (rank ", rank_,
                           "'s context failed on it and closed its connection)");
    blame_ = blamed;
  } else {
    reason_ = absl::StrCat("peer rank ", rank_, " closed the connection: its context failed",
                           blamed == self ? " (it lost contact with this rank)"
                                          : " (a wait there timed out)");
    blame_ = rank_;
  }
  schedule_.Unreachable();
}

void PeerLivenessState::GoneWith(const PeerLivenessState& other) {
  if (!reason_.empty()) return;
  reason_ = other.reason_;
  blame_ = other.blame_;
  schedule_.Unreachable();
}

void PeerLivenessState::ExplainedBy(const PeerLivenessState& earlier, absl::string_view cause) {
  if (!reason_.empty()) return;
  reason_ = absl::StrCat("peer rank ", earlier.rank_, " is gone: ", cause, " (and then rank ",
                         rank_, " too)");
  blame_ = earlier.rank_;
}

std::string PeerLivenessState::DeathReason(absl::string_view cause) const {
  if (!reason_.empty()) return reason_;
  if (unreachable()) return absl::StrCat("peer rank ", rank_, " is gone: ", cause);
  return absl::StrCat("peer rank ", rank_, " is gone: no packet from it for ",
                      dead_after().count(),
                      " ms while operations with it were pending (OPTIREDUCE_PEER_DEAD_MS)");
}

}  // namespace transport
}  // namespace optireduce
