#include "algorithms/op_stats.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace optireduce {
namespace {

std::string PhaseJson(const PhaseStats& p) {
  return absl::StrCat("{\"bytes_expected\":", p.bytes_expected,
                      ",\"bytes_received\":", p.bytes_received,
                      ",\"bytes_in_holes\":", p.bytes_in_holes, ",\"end\":\"",
                      PhaseEndName(p.end), "\",\"repaired\":", p.repaired ? "true" : "false",
                      ",\"ms\":", p.ms, ",\"late_peers\":[", absl::StrJoin(p.late_peers, ","),
                      "],\"estimated_peers\":[", absl::StrJoin(p.estimated_peers, ","), "]}");
}

}  // namespace

const char* OpModeName(OpMode mode) {
  switch (mode) {
    case OpMode::kNone: return "";
    case OpMode::kCalibration: return "calibration";
    case OpMode::kBounded: return "bounded";
    case OpMode::kReliable: return "reliable";
  }
  return "";
}

std::ostream& operator<<(std::ostream& os, OpMode mode) {
  const char* name = OpModeName(mode);
  return os << (*name != '\0' ? name : "none");
}

std::string OpStats::ToJson() const {
  return absl::StrCat("{\"op\":", op, ",\"tag\":", tag, ",\"bytes\":", bytes, ",\"rank\":", rank,
                      ",\"size\":", size,
                      ",\"group_size\":", group_size,
                      ",\"mode\":\"", OpModeName(mode), "\",\"bound_ms\":", bound_ms,
                      ",\"bound_capped\":", bound_capped ? "true" : "false",
                      ",\"start_grace_ms\":", start_grace_ms, ",\"start_lag_ms\":", start_lag_ms,
                      ",\"start_lag_gave_up\":", start_lag_gave_up ? "true" : "false",
                      ",\"phase1\":", PhaseJson(phase[0]), ",\"phase2\":", PhaseJson(phase[1]),
                      ",\"leader\":", leader,
                      ",\"deputy_decided\":", deputy_decided ? "true" : "false",
                      ",\"deferred_ranks\":[",
                      absl::StrJoin(deferred_ranks, ","), "],\"slow_ranks\":[",
                      absl::StrJoin(slow_ranks, ","), "],\"deferred_pct\":", deferred_pct,
                      ",\"carried_in\":", carried_in ? "true" : "false",
                      ",\"loss_pct\":", loss_pct, ",\"damaged\":", damaged ? "true" : "false",
                      ",\"duration_ms\":", duration_ms, "}");
}

std::string CumulativeStats::ToJson() const {
  std::string json = "{";
  const char* separator = "";
  auto fn = [&](const char* name, uint64_t value) {
    absl::StrAppend(&json, separator, "\"", name, "\":", value);
    separator = ",";
  };
  OPTIREDUCE_CUMULATIVE_STATS(OPTIREDUCE_COUNTER_VISIT)
  return json + "}";
}

StatsRegistry& StatsRegistry::Get() {
  static StatsRegistry* registry = new StatsRegistry();
  return *registry;
}

StatsRegistry::StatsRegistry() = default;

void StatsRegistry::SetLogPath(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  path_ = path;
}

void StatsRegistry::Record(const OpStats& s) {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = s;
  total_.ops++;
  if (s.mode == OpMode::kCalibration) total_.calibration_ops++;
  if (s.mode == OpMode::kBounded) total_.bounded_ops++;
  if (s.mode == OpMode::kReliable) total_.reliable_ops++;
  if (s.mode == OpMode::kBounded) {
    for (const PhaseStats& p : s.phase) {
      if (p.end == PhaseEnd::kComplete) total_.complete_phases++;
      if (p.end == PhaseEnd::kEarlyTimeout) total_.early_timeout_phases++;
      if (p.end == PhaseEnd::kDeadline) total_.deadline_phases++;
      if (p.end == PhaseEnd::kPeerTimeout) total_.peer_timeout_phases++;
      total_.bytes_expected += p.bytes_expected;
      total_.bytes_received += p.bytes_received;
    }
    if (s.phase[0].repaired || s.phase[1].repaired) total_.repaired_ops++;
    if (s.start_lag_gave_up) total_.stragglers_given_up++;
    if (s.carried_in) total_.carried_in_ops++;
    total_.carry_dropped += s.carry_dropped;
  }
  if (s.damaged) total_.damaged_ops++;
  if (!path_.empty()) {
    if (FILE* f = std::fopen(path_.c_str(), "a")) {
      std::fprintf(f, "%s\n", s.ToJson().c_str());
      std::fclose(f);
    }
  }
}

OpStats StatsRegistry::Last() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

CumulativeStats StatsRegistry::Cumulative() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

void StatsRegistry::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = OpStats();
  total_ = CumulativeStats();
}

}  // namespace optireduce
