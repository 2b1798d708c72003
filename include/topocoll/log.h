// One logger for the whole library, with NCCL's semantics so that NCCL users read it without a manual:
//   NCCL_DEBUG        VERSION | WARN | INFO | ABORT | TRACE  (each level includes the less verbose ones)
//   NCCL_DEBUG_SUBSYS INIT,BOOTSTRAP,ENV (default), ALL, or a list; a leading ^ excludes the listed ones
//   NCCL_DEBUG_FILE   a path, %h = hostname, %p = pid (default: standard output, as NCCL)
// Lines look like NCCL's:  host:pid:tid [rank] NCCL INFO Channel 00/02 : 0 1
//
//   TC_INFO(log::kInit, "comm {} rank {} nranks {}", (void*)this, rank, n);   // costs one load when off
//   TC_WARN("peer {} closed the connection", peer);
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace topocoll {
class Env;
}

namespace topocoll::log {

/// NCCL's ncclDebugLogLevel values.
enum class Level : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

/// NCCL's ncclDebugLogSubSys bits (same names, same order).
enum Subsys : uint64_t {
  kInit = 1ull << 0,
  kColl = 1ull << 1,
  kP2p = 1ull << 2,
  kShm = 1ull << 3,
  kNet = 1ull << 4,
  kGraph = 1ull << 5,
  kTuning = 1ull << 6,
  kEnv = 1ull << 7,
  kAlloc = 1ull << 8,
  kCall = 1ull << 9,
  kProxy = 1ull << 10,
  kNvls = 1ull << 11,
  kBootstrap = 1ull << 12,
  kReg = 1ull << 13,
  kProfile = 1ull << 14,
  kRas = 1ull << 15,
  kDestroy = 1ull << 16,
  kAll = ~0ull,
};
constexpr uint64_t kDefaultSubsys = kInit | kBootstrap | kEnv;

/// What the three knobs ask for.
struct Settings {
  Level level = Level::kNone;
  uint64_t subsys = kDefaultSubsys;
  std::string file;  // NCCL_DEBUG_FILE as given (%h, %p not yet expanded); empty: the default stream
};

/// Parses NCCL_DEBUG ("" = none). Throws Error(kInvalidArgument) naming the knob on an unknown value.
Level parseLevel(std::string_view value);
/// Parses NCCL_DEBUG_SUBSYS ("" = default). Throws Error(kInvalidArgument) naming the unknown subsystem.
uint64_t parseSubsys(std::string_view value);
/// Expands NCCL_DEBUG_FILE's %h (hostname, '/' and '%' replaced by '-'), %p (pid) and %%.
std::string expandFileName(std::string_view pattern);
/// The three knobs of `env`. Unknown values do not throw here (logging must never fail an operation): they are
/// reported by Config::fromEnv at the API edge; the logger keeps the defaults.
Settings settingsFromEnv(const Env& env);

/// Replaces the process-wide settings (the first log call otherwise reads the process environment).
void configure(const Settings& s);
/// Where lines go when NCCL_DEBUG_FILE is not set (NCCL: stdout; the CLI uses stderr to keep its output clean).
void setDefaultStream(FILE* stream);
/// The number shown in "[n]" on this thread's lines (NCCL shows the CUDA device; we show the rank). Default 0.
void setThreadRank(int rank);
int threadRank();

namespace detail {
extern std::atomic<int> gLevel;  // -1: not yet initialised
extern std::atomic<uint64_t> gMask;
bool enabledSlow(Level level, uint64_t subsys);
void write(Level level, uint64_t subsys, const char* file, int line, std::string_view msg);
}  // namespace detail

/// True when a line of this level and subsystem would be printed. One relaxed load on the fast path.
inline bool enabled(Level level, uint64_t subsys) {
  int g = detail::gLevel.load(std::memory_order_relaxed);
  if (g < 0) return detail::enabledSlow(level, subsys);
  return g >= static_cast<int>(level) && (detail::gMask.load(std::memory_order_relaxed) & subsys) != 0;
}

template <typename... Args>
void print(Level level, uint64_t subsys, const char* file, int line, fmt::format_string<Args...> f, Args&&... args) {
  detail::write(level, subsys, file, line, fmt::format(f, std::forward<Args>(args)...));
}

/// The last WARN line's message (NCCL's ncclGetLastError).
std::string lastError();

}  // namespace topocoll::log

#define TC_LOG_(level, subsys, ...)                                                              \
  do {                                                                                           \
    if (::topocoll::log::enabled(level, subsys))                                                 \
      ::topocoll::log::print(level, subsys, __FILE__, __LINE__, __VA_ARGS__);                    \
  } while (0)
/// An INFO line of subsystem `subsys` (a topocoll::log::Subsys bit or several or-ed).
#define TC_INFO(subsys, ...) TC_LOG_(::topocoll::log::Level::kInfo, subsys, __VA_ARGS__)
/// A WARN line: printed for every subsystem from NCCL_DEBUG=WARN up, with the source file and line; always kept as
/// lastError() (warnings are rare, so this one is not gated).
#define TC_WARN(...) \
  ::topocoll::log::print(::topocoll::log::Level::kWarn, ::topocoll::log::kAll, __FILE__, __LINE__, __VA_ARGS__)
/// A TRACE line (NCCL_DEBUG=TRACE): the function and line, and milliseconds since the logger started.
#define TC_TRACE(subsys, ...) TC_LOG_(::topocoll::log::Level::kTrace, subsys, __VA_ARGS__)
