// libFuzzer target: arbitrary bytes as an incoming bootstrap message. Must never crash, hang or accept a message
// whose header is inconsistent.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "bootstrap/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll::bootstrap;
  const uint64_t magic = 0x746f706f636f6c6cULL;
  DecodedMessage m;
  std::string why;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (decodeMessage(bytes, magic, 16, 1 << 20, &m, &why)) {
    Header h;
    std::memcpy(&h, data, sizeof(h));
    if (h.magic != magic || m.rank < 0 || m.rank >= 16 || m.body.size() != size - sizeof(Header)) __builtin_trap();
  }
  return 0;
}
