// How two-level Transpose AllReduce (TAR) groups its ranks.
//
// N ranks in N/G groups of G: rank r is member r % G of group r / G. A team is a set of
// ranks that run one TAR phase among themselves: a group (G ranks, consecutive), or the
// ranks with the same member index across the groups (N/G ranks, G apart). The flat TAR
// of N ranks is the team of everyone.
#pragma once

#include <cstddef>

namespace optireduce {

// The group size two-level TAR picks for N ranks: the largest divisor of N that is at most
// sqrt(N) (the one closest to sqrt(N) from below, so that the within-group and the
// across-group phases have about as many peers). 1 when N is prime (or below 4): the
// layout is then flat.
inline int TwoLevelGroupSize(int ranks) {
  int best = 1;
  for (int g = 2; static_cast<long>(g) * g <= ranks; g++) {
    if (ranks % g == 0) best = g;
  }
  return best;
}

// `size` ranks of a context, member m being context rank base + m * stride.
struct Team {
  int member = 0;  // this rank's index in the team
  int size = 1;
  int base = 0;
  int stride = 1;

  int Rank(int m) const { return base + m * stride; }
  // The member index of context rank `rank` (a rank of this team).
  int MemberOf(int rank) const { return (rank - base) / stride; }

  static Team Flat(int rank, int ranks) { return Team{rank, ranks, 0, 1}; }
  // The group of `rank` (groups of g).
  static Team Group(int rank, int g) { return Team{rank % g, g, rank - rank % g, 1}; }
  // The ranks with the member index of `rank`, one per group.
  static Team Across(int rank, int ranks, int g) { return Team{rank / g, ranks / g, rank % g, g}; }
};

}  // namespace optireduce
