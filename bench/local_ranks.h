// Launches N ranks of a benchmark as local processes (fork) that rendezvous through a
// FileStore in a temporary directory — no Redis needed on one host.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/device.h>

namespace optireduce {
namespace bench {

struct RankEnv {
  int rank;
  int size;
  std::shared_ptr<gloo::Context> context;
};

// Returns 0 if every rank's body returned 0, else the first non-zero status. Ranks still
// running `limit_seconds` after the start are killed. Rank 0's stdout is the report.
int RunLocalRanks(int size, const std::string& transport, int limit_seconds,
                  const std::function<int(const RankEnv&)>& body);

// A device of the named transport for this rank ("tcp"; more as they land).
std::shared_ptr<gloo::transport::Device> MakeDevice(const std::string& transport);

}  // namespace bench
}  // namespace optireduce
