// Error reporting at the API edges of topocoll.
#pragma once

#include "topocoll/export.h"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace topocoll {

/// Error categories shared by every layer (they mirror absl::StatusCode's subset we need).
enum class StatusCode { kOk, kInvalidArgument, kInvalidUsage, kNotFound, kSystemError, kRemoteError, kTimeout,
                        kAborted, kInternal };

TOPOCOLL_API const char* to_string(StatusCode code);

/// The exception every public topocoll call throws on failure. The message names the input at fault
/// (file:line, attribute, knob, rank or node) so a user can act on it without a debugger.
class TOPOCOLL_API Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

/// Throws Error(code, fmt::format(...)).
template <typename... Args>
[[noreturn]] void fail(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace topocoll
