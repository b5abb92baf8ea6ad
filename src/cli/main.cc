// moeshard: plan, build and run sharded Mixture-of-Experts layers.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "cli/cli_common.h"
#include "cli/command.h"

// CLI11's parse errors are caught below and commands return Status; anything else escaping is a
// bug that should terminate with its message.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  using moeshard::cli::CommandRunner;
  using moeshard::cli::CommandSpec;

  CLI::App app{
      "moeshard: plans, builds and runs Mixture-of-Experts layers sharded with tensor, data, "
      "pipeline and expert parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moeshard 0.1.0");

  std::vector<CommandSpec> specs = moeshard::cli::RegisteredCommands();
  std::sort(specs.begin(), specs.end(),
            [](const CommandSpec& a, const CommandSpec& b) { return a.order < b.order; });
  std::map<CLI::App*, CommandRunner> runners;
  for (const CommandSpec& spec : specs) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    runners[sub] = spec.setup(sub);
  }

  // vLLM spells some flags with one dash and several letters (-tp 8); CLI11 wants long forms.
  std::vector<std::string> args = moeshard::cli::NormalizeArgs(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "moeshard %s: error: %s\n", sub->get_name().c_str(), e.what());
        return 1;
      }
    }
  }
  return 2;
}
