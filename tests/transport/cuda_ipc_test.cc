// The CUDA IPC connect record (src/transport/cuda_ipc.h) without a GPU: its layout in the 100 bytes NCCL's
// ncclConnect leaves, what a peer's record must satisfy, and that any bytes are refused or accepted, never crash.
#include "transport/cuda_ipc.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/status.h"

namespace topocoll::transport {
namespace {

constexpr uint64_t kSize = 4 << 20;

TEST(CudaIpcRecord, FillsThePayloadExactly) {
  EXPECT_EQ(sizeof(CudaIpcInfo), 100u);
  EXPECT_EQ(offsetof(CudaIpcInfo, buf), 0u);
  EXPECT_EQ(offsetof(CudaIpcInfo, handle), 24u);
  EXPECT_EQ(offsetof(CudaIpcInfo, devSize), 88u);
  EXPECT_EQ(offsetof(CudaIpcInfo, flags), 96u);
}

// The owner's record in write mode: the receiver's, read by the sender (the peer receives: peerSends false).
CudaIpcInfo owner(bool read, bool same) {
  CudaIpcInfo i;
  i.flags = kIpcOwner | (read ? kIpcRead : 0u) | (same ? kIpcSameProcess : 0u);
  i.devSize = kSize;
  i.handle[0] = 0x40;  // a non-null address for the same-process case
  return i;
}

TEST(CudaIpcRecord, AcceptsTheOwnersAndTheOthersRecords) {
  // Write mode: the receiver owns; read mode: the sender owns.
  EXPECT_EQ(checkCudaIpcInfo(owner(false, false), false, false, false, kSize), "");
  EXPECT_EQ(checkCudaIpcInfo(owner(true, false), true, true, false, kSize), "");
  EXPECT_EQ(checkCudaIpcInfo(owner(false, true), false, false, true, kSize), "");
  CudaIpcInfo other;
  EXPECT_EQ(checkCudaIpcInfo(other, false, true, false, kSize), "");
  other.flags = kIpcRead;
  EXPECT_EQ(checkCudaIpcInfo(other, true, false, false, kSize), "");
}

TEST(CudaIpcRecord, RefusesMalformedRecordsSayingWhy) {
  auto refused = [](const CudaIpcInfo& i, bool read, bool peerSends, bool same, const char* word) {
    std::string why = checkCudaIpcInfo(i, read, peerSends, same, kSize);
    EXPECT_NE(why.find(word), std::string::npos) << why;
  };
  CudaIpcInfo i = owner(false, false);
  i.flags |= 1u << 9;
  refused(i, false, false, false, "unknown flags");
  refused(owner(true, false), false, false, false, "read mode");
  refused(owner(false, false), false, false, true, "another process");
  refused(owner(false, true), false, false, false, "this process");
  refused(owner(false, false), false, true, false, "claims");
  refused(CudaIpcInfo{}, false, false, false, "no device FIFO");
  i = owner(false, false);
  i.devSize = kSize / 2;
  refused(i, false, false, false, "NCCL_BUFFSIZE");
  i = CudaIpcInfo{};
  i.devSize = 12;
  refused(i, false, true, false, "without owning");
  i = owner(false, true);
  std::memset(i.handle, 0, sizeof i.handle);
  refused(i, false, false, true, "null");
}

TEST(CudaIpcRecord, RandomBytesAreAcceptedOnlyWhenWellFormed) {
  std::mt19937_64 gen(12345);
  int accepted = 0;
  for (int k = 0; k < 20000; ++k) {
    CudaIpcInfo i;
    auto* bytes = reinterpret_cast<unsigned char*>(&i);
    for (size_t j = 0; j < sizeof i; ++j) bytes[j] = static_cast<unsigned char>(gen());
    if (k % 2) i.flags &= kIpcKnownFlags;  // half with plausible flags
    if (k % 4 == 1) i.devSize = (i.flags & kIpcOwner) ? kSize : 0;
    const bool read = gen() & 1, peerSends = gen() & 1, same = gen() & 1;
    std::string why = checkCudaIpcInfo(i, read, peerSends, same, kSize);
    if (!why.empty()) continue;
    ++accepted;
    EXPECT_EQ(i.flags & ~kIpcKnownFlags, 0u);
    EXPECT_EQ((i.flags & kIpcRead) != 0, read);
    EXPECT_EQ((i.flags & kIpcOwner) != 0, peerSends == read);
    EXPECT_EQ(i.devSize, (i.flags & kIpcOwner) ? kSize : 0);
  }
  EXPECT_GT(accepted, 0);
}

TEST(CudaIpcRecord, SharedGpuKnobIsATestKnobOffByDefault) {
  EXPECT_EQ(Config{}.allowSharedGpu, 0);
  const Knob* k = findKnob("TOPOCOLL_ALLOW_SHARED_GPU");
  ASSERT_NE(k, nullptr);
  EXPECT_NE(k->doc.find("Tests only"), std::string::npos) << k->doc;
  EXPECT_EQ(k->defaultText(), "0");
  EXPECT_EQ(Config::fromEnv(Env(std::map<std::string, std::string>{{"TOPOCOLL_ALLOW_SHARED_GPU", "1"}})).allowSharedGpu,
            1);
  EXPECT_THROW(Config::fromEnv(Env(std::map<std::string, std::string>{{"TOPOCOLL_ALLOW_SHARED_GPU", "2"}})), Error);
}

}  // namespace
}  // namespace topocoll::transport
