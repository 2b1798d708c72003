#include "cli.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "topocoll/unique_fd.h"

#include "topocoll/status.h"
#include "topocoll/topology/discovery.h"

namespace topocoll::cli {

namespace {
constexpr const char* kDefaultTopo = "/var/run/nvidia-topologyd/virtualTopology.xml";
}  // namespace

topology::XmlDoc loadTopology(const std::string& flag, const Config& cfg, std::string* name) {
  std::string path = flag.empty() ? cfg.topoFile : flag;
  if (path.empty() && access(kDefaultTopo, R_OK) == 0) path = kDefaultTopo;
  if (!path.empty()) {
    *name = path;
    return topology::loadXmlFile(path);
  }
  *name = "<discovered>";
  return topology::discoverLocalTopology(topology::discoveryOptions(cfg));
}

void writeOut(const std::string& path, const std::string& content) {
  if (path.empty() || path == "-") {
    std::cout << content;
    return;
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(StatusCode::kSystemError, "{}: cannot open for writing", path);
  out << content;
  if (!out) fail(StatusCode::kSystemError, "{}: write error", path);
}

std::optional<std::string> unknownSubcommand(const CLI::App& app, int argc, char** argv) {
  const CLI::App* level = &app;
  std::string path = "topocoll";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') return std::nullopt;  // options: CLI11 checks them (and their values)
    auto subs = level->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return std::nullopt;  // a positional argument of a leaf command
    const CLI::App* next = nullptr;
    std::string names;
    for (const CLI::App* s : subs) {
      if (s->get_name() == arg) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) return fmt::format("'{}' is not a {} command; the commands are: {}", arg, path, names);
    path += " " + arg;
    level = next;
  }
  return std::nullopt;
}

namespace {

// Runs `argv` with `input` on its standard input and returns its standard output (no shell, no temporary file).
// Throws Error(kSystemError) when it cannot run or exits non-zero.
std::string runFilter(const std::vector<std::string>& argv, const std::string& input) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) fail(StatusCode::kSystemError, "pipe: {}", std::strerror(errno));
  UniqueFd inRead(in[0]), inWrite(in[1]);
  if (pipe2(out, O_CLOEXEC) != 0) fail(StatusCode::kSystemError, "pipe: {}", std::strerror(errno));
  UniqueFd outRead(out[0]), outWrite(out[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, inRead.get(), 0);
  posix_spawn_file_actions_adddup2(&fa, outWrite.get(), 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) fail(StatusCode::kSystemError, "cannot run '{}': {}", argv[0], std::strerror(rc));
  inRead.reset();
  outWrite.reset();
  // Feed and drain together: a large graph must not block on a full pipe.
  fcntl(inWrite.get(), F_SETFL, O_NONBLOCK);
  std::string result;
  size_t sent = 0;
  char buf[1 << 16];
  while (outRead.valid()) {
    pollfd p[2] = {{outRead.get(), POLLIN, 0}, {inWrite.valid() ? inWrite.get() : -1, POLLOUT, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents) {
      ssize_t n = ::write(inWrite.get(), input.data() + sent, input.size() - sent);
      if (n > 0) sent += static_cast<size_t>(n);
      if (sent == input.size() || (n < 0 && errno != EAGAIN && errno != EINTR)) inWrite.reset();
    }
    if (p[0].revents) {
      ssize_t n = ::read(outRead.get(), buf, sizeof(buf));
      if (n > 0) result.append(buf, static_cast<size_t>(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) outRead.reset();
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail(StatusCode::kSystemError, "'{}' failed (exit status {})", fmt::join(argv, " "),
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return result;
}

}  // namespace

std::string writeGraph(const std::string& path, const std::string& dot) {
  auto dotPos = path.rfind('.');
  std::string ext = dotPos == std::string::npos ? "" : path.substr(dotPos + 1);
  if (ext == "dot" || ext == "gv") {
    writeOut(path, dot);
    return "dot";
  }
  if (ext != "svg" && ext != "png" && ext != "pdf")
    fail(StatusCode::kInvalidUsage, "--out {}: cannot tell the format; use FILE.svg, FILE.png, FILE.pdf or FILE.dot",
         path);
  std::string rendered;
  try {
    rendered = runFilter({"dot", "-T" + ext}, dot);
  } catch (const Error& e) {
    fail(StatusCode::kSystemError, "{}: Graphviz's 'dot' is needed to write {} ({}; apt-get install graphviz), or use "
         "FILE.dot", path, ext, e.what());
  }
  writeOut(path, rendered);
  return ext;
}

std::string ringsAndTrees(const search::Connect& c, int nRanks) {
  std::string out;
  for (size_t ch = 0; ch < c.rings.size(); ++ch) {
    std::string line = fmt::format("Channel {:02d}/{:02d} :", ch, c.rings.size());
    for (int r : c.rings[ch]) line += fmt::format(" {}", r);
    out += line + "\n";
  }
  for (int r = 0; r < std::min<int>(nRanks, 64); ++r) {
    std::string line = fmt::format("Rank {:3d} Trees", r);
    for (size_t ch = 0; ch < c.trees[r].size(); ++ch) {
      const auto& t = c.trees[r][ch];
      line += fmt::format(" [{}] {}/{}/{}->{}->{}", ch, t.down[0], t.down[1], t.down[2], r, t.up);
    }
    out += line + "\n";
  }
  if (nRanks > 64) out += fmt::format("... ({} more ranks; --json has all)\n", nRanks - 64);
  return out;
}

}  // namespace topocoll::cli
