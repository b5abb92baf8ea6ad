// The moeshard executable's subcommand registry.
//
// Each subcommand lives in its own `*_command.cc` and registers itself at static-initialisation
// time with MOESHARD_REGISTER_COMMAND. The setup function adds the subcommand's flags to the
// CLI11 sub-app and returns the function that runs it (returning the process exit code).
// Command files are compiled into the executable itself (not a library), so registration is
// never dropped by the linker.
//
// Thread safety: registration happens before main(); everything else runs on the main thread.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace moeshard::cli {

using CommandRunner = std::function<int()>;

struct CommandSpec {
  std::string name;
  std::string description;
  int order = 0;  // position in --help (ascending)
  std::function<CommandRunner(CLI::App* sub)> setup;
};

bool RegisterCommand(CommandSpec spec);
const std::vector<CommandSpec>& RegisteredCommands();

}  // namespace moeshard::cli

#define MOESHARD_REGISTER_COMMAND(ident, ...)              \
  [[maybe_unused]] static const bool kRegistered_##ident = \
      ::moeshard::cli::RegisterCommand(__VA_ARGS__)
