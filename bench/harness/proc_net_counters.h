// proc_net_counters.h — the kernel's protocol counters of one network namespace as
// /proc/net/snmp and /proc/net/netstat print them.
//
// Both files hold, per group, a line of names then a line of values, each starting with
// the group's prefix ("Tcp:", "TcpExt:"):
//   TcpExt: SyncookiesSent TCPDSACKRecv ...
//   TcpExt: 0 12 ...
// Parse checks that shape (every group has both lines, as many values as names) and keeps
// the values as text; Get converts the one asked for, so a signed value elsewhere in the
// file (Tcp MaxConn is -1) is no error.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optireduce {
namespace bench {

class ProcNetCounters {
 public:
  // `text` is the file's contents; `origin` (e.g. the path) names it in errors. An error
  // names the line that breaks the shape: a line without a "Group:" prefix, a group whose
  // names line has no values line after it, a values line of another length.
  static absl::StatusOr<ProcNetCounters> Parse(absl::string_view text, std::string origin);

  // Parse of the file at `path` (an error if it cannot be read).
  static absl::StatusOr<ProcNetCounters> Read(const std::string& path);

  // Whether the file has counter `name` of `group` ("TcpExt", no colon).
  bool Has(absl::string_view group, absl::string_view name) const;

  // Counter `name` of `group`. NotFound if the file has no such counter (older kernels
  // lack newer counters); InvalidArgument if its value is not an unsigned integer.
  absl::StatusOr<uint64_t> Get(absl::string_view group, absl::string_view name) const;

 private:
  std::string origin_;
  absl::flat_hash_map<std::string, std::string> values_;  // "Group:Name" -> value text
};

}  // namespace bench
}  // namespace optireduce
