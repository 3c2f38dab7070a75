#include "bench/harness/proc_net_counters.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace optireduce {
namespace bench {
namespace {

struct Line {
  std::string group;                // the prefix without its colon
  std::vector<absl::string_view> words;  // after the prefix
};

absl::StatusOr<Line> SplitLine(absl::string_view text, const std::string& origin, int number) {
  std::vector<absl::string_view> words = absl::StrSplit(text, ' ', absl::SkipWhitespace());
  if (words.empty() || words[0].size() < 2 || words[0].back() != ':') {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, " line ", number, ": expected 'Group: ...', got '", text, "'"));
  }
  Line l;
  l.group = std::string(words[0].substr(0, words[0].size() - 1));
  l.words.assign(words.begin() + 1, words.end());
  return l;
}

}  // namespace

absl::StatusOr<ProcNetCounters> ProcNetCounters::Parse(absl::string_view text,
                                                       std::string origin) {
  ProcNetCounters c;
  c.origin_ = std::move(origin);
  // Groups whose names line was read and whose values line is next.
  absl::flat_hash_map<std::string, std::pair<std::vector<absl::string_view>, int>> names;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    if (raw.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    absl::StatusOr<Line> l = SplitLine(raw, c.origin_, number);
    if (!l.ok()) return l.status();
    auto it = names.find(l->group);
    if (it == names.end()) {
      names.emplace(l->group, std::make_pair(std::move(l->words), number));
      continue;
    }
    const std::vector<absl::string_view>& n = it->second.first;
    if (n.size() != l->words.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.origin_, " line ", number, ": ", l->words.size(), " values for the ", n.size(),
          " names of ", l->group, " on line ", it->second.second));
    }
    for (size_t i = 0; i < n.size(); ++i) {
      c.values_[absl::StrCat(l->group, ":", n[i])] = std::string(l->words[i]);
    }
    names.erase(it);
  }
  if (!names.empty()) {
    const auto& [group, n] = *names.begin();
    return absl::InvalidArgumentError(absl::StrCat(c.origin_, " line ", n.second,
                                                   ": names of ", group,
                                                   " with no values line after them"));
  }
  return c;
}

absl::StatusOr<ProcNetCounters> ProcNetCounters::Read(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return Parse(text.str(), path);
}

bool ProcNetCounters::Has(absl::string_view group, absl::string_view name) const {
  return values_.contains(absl::StrCat(group, ":", name));
}

absl::StatusOr<uint64_t> ProcNetCounters::Get(absl::string_view group,
                                              absl::string_view name) const {
  auto it = values_.find(absl::StrCat(group, ":", name));
  if (it == values_.end()) {
    return absl::NotFoundError(
        absl::StrCat(origin_, " has no counter ", group, " ", name));
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || it->second.front() == '-' ||
      it->second.front() == '+') {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": ", group, " ", name, " is '",
                                                   it->second, "', not an unsigned integer"));
  }
  return v;
}

}  // namespace bench
}  // namespace optireduce
