// 64 MiB of every type between two ranks over each transport (labelled slow: left out of the sanitizer run).
#include <gtest/gtest.h>

#include "ranks.h"
#include "topocoll/status.h"

namespace topocoll::runtime {
namespace {

using testing::force;
using testing::runRanks;
using testing::Transport;

// 64 MiB of every type between two ranks, both ways at once, per transport (words filled and checked fast).
class BigMessages : public ::testing::TestWithParam<Transport> {};

TEST_P(BigMessages, SixtyFourMiBOfEveryType) {
  Transport tr = GetParam();
  const size_t bytes = 64u << 20;
  auto errors = runRanks(
      2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
      [&](Communicator& c, int r) {
        std::vector<uint64_t> out(bytes / 8), in(bytes / 8);
        for (int t = 0; t < kNumDataTypes; ++t) {
          DataType dt = static_cast<DataType>(t);
          size_t count = bytes / sizeOf(dt);
          for (size_t i = 0; i < out.size(); ++i) out[i] = (uint64_t(r) << 56) ^ (uint64_t(t) << 48) ^ (i * 0x9e3779b1);
          std::fill(in.begin(), in.end(), 0);
          groupStart();
          c.send(out.data(), count, dt, 1 - r);
          c.recv(in.data(), count, dt, 1 - r);
          groupEnd();
          for (size_t i = 0; i < in.size(); ++i)
            if (in[i] != ((uint64_t(1 - r) << 56) ^ (uint64_t(t) << 48) ^ (i * 0x9e3779b1)))
              throw Error(StatusCode::kInternal, fmt::format("{}: word {} wrong", to_string(dt), i));
        }
      });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

INSTANTIATE_TEST_SUITE_P(Transports, BigMessages, ::testing::Values(Transport::kP2p, Transport::kShm, Transport::kNet),
                         [](const auto& info) { return std::string(testing::name(info.param)); });

}  // namespace
}  // namespace topocoll::runtime
