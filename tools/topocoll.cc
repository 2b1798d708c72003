// topocoll: plan what NCCL would do on a machine, from its topology XML; initialise communicators under a launcher.
#include <cstdio>

#include "cli.h"
#include "topocoll/log.h"
#include "topocoll/status.h"
#include "topocoll/version.h"

using namespace topocoll;

int main(int argc, char** argv) {
  CLI::App app{"topocoll: what NCCL 2.30.7 would build on a machine, from its topology XML.\n"
               "Reads NCCL's environment knobs (NCCL_TOPO_FILE, NCCL_P2P_LEVEL, NCCL_ALGO, ...): `topocoll params`."};
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  topocoll topo show --topo dgx-h100.xml\n"
      "  topocoll topo matrix --topo dgx-h100.xml\n"
      "  topocoll plan --topo dgx-h100.xml --nodes 4 --explain\n"
      "  topocoll plan --topo dgx-h100.xml --nodes 2 --optimize --graph-out better.xml   (then NCCL_GRAPH_FILE=better.xml)\n"
      "  topocoll whatif --topo dgx-h100.xml --nodes 2 --remove-nic NET3 --nvlink-count GPU2=12\n"
      "  NCCL_ALGO=ring topocoll tune --topo dgx-h100.xml --nodes 2 --coll allreduce --plot busbw.svg\n"
      "  mpirun -np 8 -x NCCL_TOPO_FILE=dgx-h100.xml -x TOPOCOLL_SIMULATE_GPUS=1 topocoll comm-check\n"
      "Exit status: 0 ok, 1 bad input or failure (the message names the file:line, attribute, knob or rank), 2 invalid\n"
      "usage (unknown command or flag, conflicting flags, an NCCL_ALGO naming no algorithm, no algorithm enabled),\n"
      "3 internal error. Warnings go to standard error (NCCL_DEBUG=VERSION silences them).");
  app.set_version_flag("--version", "topocoll " TOPOCOLL_VERSION_FULL " (NCCL " TOPOCOLL_NCCL_REFERENCE " rules)");

  std::vector<cli::Command> cmds = cli::addTopoCommands(app);
  for (auto& c : cli::addPlanCommands(app)) cmds.push_back(std::move(c));
  cmds.push_back(cli::addParamsCommand(app));
  cmds.push_back(cli::addCommCheckCommand(app));
  cmds.push_back(cli::addWhatIfCommand(app));

  log::setDefaultStream(stderr);  // stdout carries the command's output (JSON, XML)
  if (auto unknown = cli::unknownSubcommand(app, argc, argv)) {
    std::fprintf(stderr, "topocoll: error: %s\nRun with --help for more information.\n", unknown->c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version succeed; every other parse error is invalid usage
  }

  try {
    Env env = Env::fromProcess();
    // The CLI shows warnings (ignored elements, dropped connections) unless NCCL_DEBUG says otherwise.
    log::Settings logSettings = log::settingsFromEnv(env);
    if (!env.get("NCCL_DEBUG")) logSettings.level = log::Level::kWarn;
    log::configure(logSettings);
    Config cfg = Config::fromEnv(env);
    for (auto& c : cmds)
      if (c.app->parsed()) return c.run(env, cfg);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "topocoll: error: %s\n", e.what());
    return e.code() == StatusCode::kInvalidUsage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topocoll: internal error: %s\n", e.what());
    return 3;
  }
}
