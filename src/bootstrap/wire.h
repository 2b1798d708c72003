// The bootstrap's wire format: every message is a fixed header then `size` bytes. Decoding is a pure function
// so that it can be fuzzed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace topocoll::bootstrap {

#pragma pack(push, 1)
struct Header {
  uint64_t magic = 0;
  int32_t rank = 0;
  int32_t tag = 0;
  uint64_t size = 0;
};
#pragma pack(pop)

/// Checks a header against the job: magic, sender rank in range, size bounded. Empty string when acceptable.
std::string checkHeader(const Header& h, uint64_t magic, int nRanks, size_t maxBytes);

struct DecodedMessage {
  int rank = 0, tag = 0;
  std::vector<uint8_t> body;
};

/// Decodes one complete message from `bytes`; false (with the reason) when it must be dropped.
bool decodeMessage(std::string_view bytes, uint64_t magic, int nRanks, size_t maxBytes, DecodedMessage* out,
                   std::string* why);

}  // namespace topocoll::bootstrap
