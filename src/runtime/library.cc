// libtopocoll.so's own part: its version, readable with `strings libtopocoll.so | grep 'topocoll version'` and from
// tcclGetVersion. Everything else in the library comes whole from the layers (cmake/package.cmake).
#include "topocoll/version.h"

namespace {
[[gnu::used]] const char kIdent[] = "topocoll version " TOPOCOLL_VERSION_FULL " (NCCL " TOPOCOLL_NCCL_REFERENCE " rules)";
}  // namespace
