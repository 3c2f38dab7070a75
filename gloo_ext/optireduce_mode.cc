#include "gloo_ext/optireduce_mode.h"

#include <unistd.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "algorithms/allreduce.h"
#include "algorithms/op_stats.h"
#include "gloo_ext/config.h"

namespace optireduce {
namespace gloo_ext {

void RunOptiReduce(const ::gloo::AllreduceOptions& opts, const ReduceKind& kind) {
  const Config& config = GetConfigOrThrow();
  static std::once_flag once;
  std::call_once(once, [&config] {
    TimeoutOptions timeouts;
    if (config.timeout.count() > 0) timeouts.hard_cap = config.timeout;
    timeouts.repair_budget_fraction = config.repair_budget;
    timeouts.learn_start_grace = config.learn_start_grace;
    SetDefaultTimeoutOptions(timeouts);
    if (!config.stats_file.empty()) {
      StatsRegistry::Get().SetLogPath(
          absl::StrReplaceAll(config.stats_file, {{"%p", std::to_string(getpid())}}));
    }
  });
  AllreduceOptions extras(GlooOptionsOf(opts).context);
  extras.setDataType(kind.type);
  extras.setReduceOp(kind.op);
  extras.setMode(AllreduceOptions::Mode::kBounded);
  extras.setHadamard(HadamardFor(config.hadamard));
  extras.setMaxLoss(config.max_loss);
  SetLayout(config.layout, &extras);
  optireduce::allreduce(opts, extras);
}

void SetLayout(const LayoutChoice& choice, AllreduceOptions* extras) {
  switch (choice.layout) {
    case LayoutSetting::kAuto:
      extras->setLayout(AllreduceOptions::Layout::kAuto);
      break;
    case LayoutSetting::kFlat:
      extras->setLayout(AllreduceOptions::Layout::kFlat);
      break;
    case LayoutSetting::kTwoLevel:
      extras->setLayout(AllreduceOptions::Layout::kTwoLevel);
      break;
  }
  if (choice.group_size > 0) extras->setGroupSize(static_cast<size_t>(choice.group_size));
}

std::string OptiReduceStatsJson() {
  const StatsRegistry& registry = StatsRegistry::Get();
  return absl::StrCat("{\"last\":", registry.Last().ToJson(),
                      ",\"cumulative\":", registry.Cumulative().ToJson(), "}");
}

void ResetOptiReduceStats() { StatsRegistry::Get().Reset(); }

}  // namespace gloo_ext
}  // namespace optireduce
