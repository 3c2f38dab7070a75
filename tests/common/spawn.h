// Starting a test's worker processes: fork + exec of a binary with its arguments.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
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

// A new directory /tmp/<prefix>_XXXXXX with `subdirs` in it, for a test's workers; ""
// if it cannot be made.
inline std::string MakeWorkerDir(const std::string& prefix,
                                 std::initializer_list<const char*> subdirs) {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  for (const char* d : subdirs) std::filesystem::create_directory(tmpl + "/" + d);
  return tmpl;
}

// Test teardown: kills and reaps every worker still listed (pid > 0), then removes `dir`.
inline void KillWorkersAndRemove(const std::vector<pid_t>& pids, const std::string& dir) {
  for (pid_t p : pids) {
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  std::error_code ec;
  if (!dir.empty()) std::filesystem::remove_all(dir, ec);
}

}  // namespace testing
}  // namespace optireduce
