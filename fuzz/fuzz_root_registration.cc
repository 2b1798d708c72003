// libFuzzer target: the root's side of registration, as its event loop runs it: every connection's bytes through
// the registration parser, every complete registration into the book. Strangers must be dropped, faults of the job
// (a rank twice, another job size) must be named, and the book must stay consistent, whatever arrives.
//
// Input: [root's job size: 1 byte, 0 = learn from the first rank][connections: [length: 2 bytes][bytes]...]
#include <cstddef>
#include <cstdint>
#include <string>

#include "bootstrap/wire.h"

namespace {
constexpr uint64_t kMagic = 0x746f706f636f6c6cULL;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll::bootstrap;
  if (size < 1) return 0;
  RegistrationBook book(data[0] % 9);
  size_t at = 1;
  int accepted = 0;
  while (at + 2 <= size) {
    size_t len = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    if (len > size - at) len = size - at;
    MessageParser parser({kMagic, 0, sizeof(Registration)});
    size_t used = 0;
    while (used < len && !parser.done() && !parser.rejected()) used += parser.feed(data + at + used, len - used);
    at += len;
    if (parser.rejected()) {
      // A foreign magic is answered "a different job's root" only for what looks like a registration.
      if (parser.foreignMagic() && parser.header().magic == kMagic) __builtin_trap();
      continue;
    }
    if (!parser.done()) continue;  // the connection closed early: dropped
    std::string why;
    int before = book.registered();
    auto verdict = book.add(parser.header(), parser.body(), &why);
    if (verdict == RegistrationBook::Verdict::kAccepted) {
      ++accepted;
      if (!book.has(parser.header().rank) || book.registered() != before + 1 || !why.empty()) __builtin_trap();
    } else if (why.empty() || book.registered() != before) {
      __builtin_trap();
    }
    if (book.registered() > book.nRanks() || book.complete() != (book.nRanks() > 0 && book.registered() == book.nRanks()))
      __builtin_trap();
  }
  if (accepted != book.registered()) __builtin_trap();
  if (book.nRanks() > 0 && !book.complete() && book.missingText().find("never registered") == std::string::npos)
    __builtin_trap();
  return 0;
}
