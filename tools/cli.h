// The topocoll CLI's pieces: each subcommand registers itself on the app and returns what runs when it is named;
// main() (topocoll.cc) parses, runs the one named and maps errors to the documented exit codes.
#pragma once

#include <functional>
#include <optional>
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

/// When argv names a subcommand `app` (or one of its subcommands) does not have: "'bogus' is not a topocoll command;
/// the commands are: topo, plan, ...". Checked before parsing, so that the message names the command, not a
/// missing one.
std::optional<std::string> unknownSubcommand(const CLI::App& app, int argc, char** argv);

/// --topo, else NCCL_TOPO_FILE, else NCCL's default virtual topology file, else discovery of this machine.
topology::XmlDoc loadTopology(const std::string& flag, const Config& cfg, std::string* name);
/// Writes `content` to `path` ("" or "-": standard output).
void writeOut(const std::string& path, const std::string& content);
/// Writes Graphviz dot text to `path` in the format its extension names: .dot as is; .svg, .png, .pdf rendered by
/// Graphviz's `dot`. Throws Error(kInvalidUsage) for another extension, Error(kSystemError) when `dot` is missing or
/// fails. Returns the format written.
std::string writeGraph(const std::string& path, const std::string& dot);
/// NCCL's "Channel cc/nn : ..." ring lines and each rank's "Trees [c] d0/d1/d2->r->up" (the first 64 ranks).
std::string ringsAndTrees(const search::Connect& c, int nRanks);

}  // namespace topocoll::cli
