// The GPU path's vocabulary (include/topocoll/cuda.h) behaves on a machine without a GPU as on one with it.
#include "topocoll/cuda.h"

#include <gtest/gtest.h>

#include <vector>

#include "topocoll/status.h"

namespace topocoll::cuda {
namespace {

TEST(Cuda, ReasonIsGivenExactlyWhenNoDevice) {
  if (deviceCount() == 0) {
    EXPECT_FALSE(unavailableReason().empty());
  } else {
    EXPECT_TRUE(built());
    EXPECT_EQ(unavailableReason(), "");
  }
  if (!built()) {
    EXPECT_EQ(deviceCount(), 0);
  }
}

TEST(Cuda, HostMemoryIsHost) {
  std::vector<int> v(16);
  EXPECT_EQ(locate(v.data()).kind, MemoryKind::kHost);
  EXPECT_EQ(locate(nullptr).kind, MemoryKind::kHost);
  int local = 0;
  EXPECT_EQ(locate(&local).kind, MemoryKind::kHost);
}

TEST(Cuda, CheckThrowsNamingTheCall) {
  EXPECT_NO_THROW(TC_CUDA(0));
  try {
    TC_CUDA(2);  // cudaErrorMemoryAllocation
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kSystemError);
    EXPECT_NE(std::string(e.what()).find("2 failed at"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda_test.cc"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace topocoll::cuda
