// libFuzzer target: the parser every byte a rank receives goes through (ring connections, point-to-point
// messages, aborts; and the root's answers on its control stream), fed in arbitrary splits, several messages per
// stream. It must never crash, never read past a message, and never accept a header that breaks the job's rules.
//
// Input: [senders: 1 byte][split seed: 1 byte][the stream's bytes...]
#include <cstddef>
#include <cstdint>

#include "bootstrap/wire.h"

namespace {
constexpr uint64_t kMagic = 0x746f706f636f6c6cULL;
constexpr size_t kMaxBytes = 1 << 16;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll::bootstrap;
  if (size < 2) return 0;
  const int nRanks = data[0] % 17;  // 0: the root's control stream (sender -1 or any rank)
  uint32_t rng = data[1] * 2654435761u + 1;
  const uint8_t* p = data + 2;
  size_t left = size - 2;
  MessageParser parser({kMagic, nRanks, kMaxBytes});
  size_t messageBytes = 0;
  while (left > 0) {
    rng = rng * 1103515245u + 12345u;
    size_t chunk = 1 + (rng >> 16) % 64;
    if (chunk > left) chunk = left;
    size_t used = parser.feed(p, chunk);
    if (used > chunk) __builtin_trap();
    p += used;
    left -= used;
    messageBytes += used;
    if (parser.rejected()) {
      if (parser.why().empty() || messageBytes > sizeof(Header)) __builtin_trap();
      break;
    }
    if (parser.done()) {
      const Header& h = parser.header();
      bool rankOk = nRanks > 0 ? (h.rank >= 0 && h.rank < nRanks) : h.rank >= -1;
      if (h.magic != kMagic || !rankOk || h.size > kMaxBytes || parser.body().size() != h.size ||
          messageBytes != sizeof(Header) + h.size)
        __builtin_trap();
      parser.reset();  // the stream's next message (the control stream carries several)
      messageBytes = 0;
      continue;
    }
    if (used < chunk) __builtin_trap();  // neither complete nor rejected: it takes everything offered
  }
  return 0;
}
