// The logger. Line format and knob semantics follow NCCL 2.30.7's src/debug.cc (Apache-2.0; see NOTICE); the code
// is our own.
#include "topocoll/log.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>

#include "topocoll/env.h"
#include "topocoll/status.h"

namespace topocoll::log {

namespace detail {
std::atomic<int> gLevel{-1};
std::atomic<uint64_t> gMask{kDefaultSubsys};
}  // namespace detail

namespace {

struct SubsysName {
  const char* name;
  uint64_t bit;
};
constexpr SubsysName kSubsysNames[] = {
    {"INIT", kInit},   {"COLL", kColl},           {"P2P", kP2p},     {"SHM", kShm},         {"NET", kNet},
    {"GRAPH", kGraph}, {"TUNING", kTuning},       {"ENV", kEnv},     {"ALLOC", kAlloc},     {"CALL", kCall},
    {"PROXY", kProxy}, {"NVLS", kNvls},           {"BOOTSTRAP", kBootstrap}, {"REG", kReg}, {"PROFILE", kProfile},
    {"RAS", kRas},     {"DESTROY", kDestroy},     {"ALL", kAll},
};

struct State {
  std::mutex mu;
  FILE* defaultStream = stdout;
  FILE* file = nullptr;  // owned when opened from NCCL_DEBUG_FILE
  std::string hostname;
  int pid = 0;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  std::string lastError;
  std::string filePattern;  // NCCL_DEBUG_FILE as given, while `file` is open (a forked child reopens it: %p)
  bool explicitlyConfigured = false;
  ~State() {
    if (file) std::fclose(file);
  }
};

thread_local int tlsRank = 0;
thread_local int tlsTid = -1;

void forkPrepare();
void forkParent();
void forkChild();

State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: threads may log during static destruction
    // A forked child (topocoll-perf -np, launchers, Python's multiprocessing) logs as itself: its own pid in the
    // line prefix and, with %p in NCCL_DEBUG_FILE, its own file (it wrote under its parent's pid into the parent's
    // file before). The lock is held across fork so that no other thread's half-written line is copied.
    pthread_atfork(forkPrepare, forkParent, forkChild);
    return st;
  }();
  return *s;
}

void forkPrepare() {
  State& st = state();
  st.mu.lock();
  if (st.file) std::fflush(st.file);
}

void forkParent() { state().mu.unlock(); }

void forkChild() {
  State& st = state();
  st.pid = static_cast<int>(getpid());
  tlsTid = -1;  // the forking thread's cached id is its parent's thread
  if (st.file && st.filePattern.find("%p") != std::string::npos) {
    std::fclose(st.file);  // this process's copy of the descriptor; the parent's stays open
    st.file = std::fopen(expandFileName(st.filePattern).c_str(), "w");
    if (st.file) setvbuf(st.file, nullptr, _IOLBF, 0);
  }
  st.mu.unlock();
}

std::string upper(std::string_view v) {
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view v) {
  size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(v.substr(b, e - b + 1));
}

std::string hostnameForLog() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) std::strcpy(buf, "unknown");
  std::string h(buf);
  // NCCL cuts the hostname at the first '.' and replaces characters that would break a file name.
  if (auto dot = h.find('.'); dot != std::string::npos) h.resize(dot);
  for (auto& c : h)
    if (c == '/' || c == '%') c = '-';
  return h;
}

// Caller holds state().mu.
void applyLocked(State& st, const Settings& s) {
  if (st.file) {
    std::fclose(st.file);
    st.file = nullptr;
  }
  st.hostname = hostnameForLog();
  st.pid = static_cast<int>(getpid());
  if (s.level > Level::kVersion && !s.file.empty()) {
    std::string path = expandFileName(s.file);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      setvbuf(f, nullptr, _IOLBF, 0);
      st.file = f;
      st.filePattern = s.file;
    }
  }
  detail::gMask.store(s.subsys, std::memory_order_relaxed);
  detail::gLevel.store(static_cast<int>(s.level), std::memory_order_release);
}

}  // namespace

Level parseLevel(std::string_view value) {
  std::string v = upper(trim(value));
  if (v.empty()) return Level::kNone;
  if (v == "VERSION") return Level::kVersion;
  if (v == "WARN") return Level::kWarn;
  if (v == "INFO") return Level::kInfo;
  if (v == "ABORT") return Level::kAbort;
  if (v == "TRACE") return Level::kTrace;
  fail(StatusCode::kInvalidArgument, "NCCL_DEBUG={}: expected VERSION, WARN, INFO, ABORT or TRACE", value);
}

uint64_t parseSubsys(std::string_view value) {
  std::string v = trim(value);
  if (v.empty()) return kDefaultSubsys;
  bool invert = v[0] == '^';
  if (invert) v.erase(0, 1);
  uint64_t mask = 0;
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string tok = upper(trim(std::string_view(v).substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)));
    if (!tok.empty()) {
      bool found = false;
      for (auto& n : kSubsysNames)
        if (tok == n.name) {
          mask |= n.bit;
          found = true;
        }
      if (!found)
        fail(StatusCode::kInvalidArgument,
             "NCCL_DEBUG_SUBSYS={}: unknown subsystem '{}' (expected INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, "
             "ALLOC, CALL, PROXY, NVLS, BOOTSTRAP, REG, PROFILE, RAS, DESTROY or ALL, optionally after ^)",
             value, tok);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

std::string expandFileName(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    char c = pattern[++i];
    if (c == 'h') out += hostnameForLog();
    else if (c == 'p') out += std::to_string(getpid());
    else if (c == '%') out += '%';
    else {
      out += '%';
      out += c;
    }
  }
  return out;
}

Settings settingsFromEnv(const Env& env) {
  Settings s;
  try {
    s.level = parseLevel(env.get("NCCL_DEBUG").value_or(""));
  } catch (const Error&) {
  }
  try {
    s.subsys = parseSubsys(env.get("NCCL_DEBUG_SUBSYS").value_or(""));
  } catch (const Error&) {
  }
  s.file = env.get("NCCL_DEBUG_FILE").value_or("");
  return s;
}

void configure(const Settings& s) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.explicitlyConfigured = true;
  applyLocked(st, s);
}

void setDefaultStream(FILE* stream) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.defaultStream = stream;
}

void setThreadRank(int rank) { tlsRank = rank; }
int threadRank() { return tlsRank; }

std::string lastError() {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.lastError;
}

namespace detail {

bool enabledSlow(Level level, uint64_t subsys) {
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    if (gLevel.load(std::memory_order_acquire) < 0) applyLocked(st, settingsFromEnv(Env::fromProcess()));
  }
  return enabled(level, subsys);
}

void write(Level level, uint64_t subsys, const char* file, int line, std::string_view msg) {
  State& st = state();
  if (level == Level::kWarn) {
    std::lock_guard<std::mutex> lk(st.mu);
    st.lastError.assign(msg);
  }
  if (!enabled(level, subsys)) return;
  if (tlsTid < 0) tlsTid = static_cast<int>(syscall(SYS_gettid));
  std::string out;
  out.reserve(msg.size() + 96);
  std::lock_guard<std::mutex> lk(st.mu);
  if (level == Level::kWarn) out += '\n';
  if (level != Level::kVersion) out += fmt::format("{}:{}:{} ", st.hostname, st.pid, tlsTid);
  const char* base = file ? std::strrchr(file, '/') : nullptr;
  base = base ? base + 1 : (file ? file : "<unknown>");
  switch (level) {
    case Level::kWarn: out += fmt::format("[{}] {}:{} NCCL WARN ", tlsRank, base, line); break;
    case Level::kInfo: out += fmt::format("[{}] NCCL INFO ", tlsRank); break;
    case Level::kTrace: {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - st.epoch).count();
      out += fmt::format("[{}] {:f} {}:{} NCCL TRACE ", tlsRank, ms, base, line);
      break;
    }
    default: break;
  }
  out.append(msg);
  out += '\n';
  FILE* f = st.file ? st.file : st.defaultStream;
  std::fwrite(out.data(), 1, out.size(), f);
  std::fflush(f);
}

}  // namespace detail

}  // namespace topocoll::log
