// Starting a test's worker processes: fork + exec of a binary with its arguments.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace optireduce {
namespace testing {

// Runs argv[0] with `argv` in a child process; returns its pid (-1 if fork failed). A
// child whose exec fails exits with 127.
inline pid_t SpawnProcess(const std::vector<std::string>& argv) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

}  // namespace testing
}  // namespace optireduce
