#include "topocoll/status.h"

namespace topocoll {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kInvalidUsage: return "invalid usage";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kSystemError: return "system error";
    case StatusCode::kRemoteError: return "remote error";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

}  // namespace topocoll
