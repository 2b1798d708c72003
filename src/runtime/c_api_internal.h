// What NCCL's API (nccl_api.cc) needs of the C API's internals beyond topocoll.h.
#pragma once

#include <string>

#include "topocoll/status.h"
#include "topocoll/topocoll.h"

namespace topocoll::runtime::capi {

/// Fails a call as the C API fails one: `why` becomes the thread's (and `comm`'s, when it is a handle) last error,
/// logged as a WARN line, and the result is `code`'s. `what` names the call ("ncclCommSplit").
tcclResult_t refuse(tcclComm_t comm, const char* what, StatusCode code, const std::string& why);
/// Whether `comm` moves host memory only (no device buffers of its own): fails as any call on a bad handle.
tcclResult_t hostMemory(tcclComm_t comm, bool* host);

}  // namespace topocoll::runtime::capi
