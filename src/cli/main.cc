// moeshard: plan, build and run sharded Mixture-of-Experts layers.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "cli/command.h"

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

  try {
    app.parse(argc, argv);
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
