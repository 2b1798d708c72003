// The topocoll CLI's pieces: each subcommand registers itself on the app and returns what runs when it is named;
// main() (topocoll.cc) parses, runs the one named and maps errors to the documented exit codes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/search/connect.h"
#include "topocoll/topology/xml.h"

namespace topocoll::cli {

/// A leaf subcommand and its action (returns the exit status). Options live in state the action owns.
struct Command {
  CLI::App* app;
  std::function<int(const Env& env, Config& cfg)> run;
};

std::vector<Command> addTopoCommands(CLI::App& app);  // topo dump | show | matrix | paths | draw
std::vector<Command> addPlanCommands(CLI::App& app);  // plan, tune
Command addParamsCommand(CLI::App& app);              // params
Command addCommCheckCommand(CLI::App& app);           // comm-check
Command addWhatIfCommand(CLI::App& app);              // whatif

/// --topo, else NCCL_TOPO_FILE, else NCCL's default virtual topology file, else discovery of this machine.
topology::XmlDoc loadTopology(const std::string& flag, const Config& cfg, std::string* name);
/// Writes `content` to `path` ("" or "-": standard output).
void writeOut(const std::string& path, const std::string& content);
/// Renders Graphviz dot text as SVG with the `dot` program.
std::string dotToSvg(const std::string& dot);
bool endsWith(const std::string& s, const std::string& suffix);
/// NCCL's "Channel cc/nn : ..." ring lines and each rank's "Trees [c] d0/d1/d2->r->up" (the first 64 ranks).
std::string ringsAndTrees(const search::Connect& c, int nRanks);

}  // namespace topocoll::cli
