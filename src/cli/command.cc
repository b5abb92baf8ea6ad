#include "cli/command.h"

namespace moeshard::cli {

static std::vector<CommandSpec>& Registry() {
  static std::vector<CommandSpec> commands;
  return commands;
}

bool RegisterCommand(CommandSpec spec) {
  Registry().push_back(std::move(spec));
  return true;
}

const std::vector<CommandSpec>& RegisteredCommands() { return Registry(); }

}  // namespace moeshard::cli
