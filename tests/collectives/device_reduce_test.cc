// The GPU reductions against the host's reduceMany + finishAvg, bit for bit: every type x op x {1, 2, 3, 8}
// sources x {0, 1, 7, 1023, 2^20+3} elements, with the pointers 16-byte aligned, all at the same odd offset (head,
// 16-byte body, tail), at mixed offsets (element by element), and dst aliasing srcs[0]. One exception, by design
// (include/topocoll/collectives/device.h): where arithmetic makes a NaN, the host's and the GPU's NaN bit patterns
// differ (x86 returns an operand's NaN, the GPU its canonical one), so a NaN matches any NaN of the type. Skips
// without a GPU; the argument checks run everywhere.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "topocoll/collectives/device.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/cuda.h"
#include "topocoll/status.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::collectives {
namespace {

template <typename F>
StatusCode codeOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return StatusCode::kOk;
}

TEST(DeviceReduceArgs, BadArgumentsAreRejectedBeforeAnyDeviceWork) {
  int a = 0, b = 0;
  const void* srcs[device::kMaxSources + 1] = {};
  for (auto& s : srcs) s = &a;
  auto reduce = [&](DataType t, RedOp op, int n, size_t count, int avg) {
    return codeOf([&] { device::reduce(t, op, &b, srcs, n, count, avg, nullptr); });
  };
  EXPECT_EQ(reduce(static_cast<DataType>(12), RedOp::kSum, 2, 1, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce(static_cast<DataType>(-1), RedOp::kSum, 2, 1, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce(DataType::kFloat32, static_cast<RedOp>(5), 2, 1, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce(DataType::kFloat32, RedOp::kSum, 0, 1, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce(DataType::kFloat32, RedOp::kSum, device::kMaxSources + 1, 1, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce(DataType::kFloat32, RedOp::kAvg, 2, 1, -1), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce(DataType::kUint8, RedOp::kAvg, 2, 1, 256), StatusCode::kInvalidArgument);  // divides by 0
  EXPECT_EQ(reduce(DataType::kFloat32, RedOp::kSum, 0, 0, 0), StatusCode::kInvalidArgument);  // even when empty
  EXPECT_EQ(codeOf([&] { device::reduce(DataType::kInt32, RedOp::kSum, nullptr, srcs, 2, 4, 0, nullptr); }),
            StatusCode::kInvalidArgument);
  srcs[1] = nullptr;
  EXPECT_EQ(reduce(DataType::kInt32, RedOp::kMax, 2, 4, 0), StatusCode::kInvalidArgument);
  try {
    reduce(DataType::kInt32, RedOp::kMax, 2, 4, 0);
    device::reduce(DataType::kInt32, RedOp::kMax, &b, srcs, 2, 4, 0, nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max"), std::string::npos) << e.what();
  }
  // Nothing to do is not an error (buffers of no elements may be null, as in NCCL's API).
  EXPECT_EQ(reduce(DataType::kFloat32, RedOp::kSum, 2, 0, 0), StatusCode::kOk);
  EXPECT_EQ(codeOf([] { device::copy(nullptr, nullptr, 0, nullptr); }), StatusCode::kOk);
}

TEST(DeviceReduceArgs, WithoutAGpuTheCallsSayWhy) {
  if (device::available()) GTEST_SKIP() << "a GPU is usable here";
  int a = 1, b = 0;
  const void* srcs[1] = {&a};
  try {
    device::reduce(DataType::kInt32, RedOp::kSum, &b, srcs, 1, 1, 0, nullptr);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find(cuda::unavailableReason()), std::string::npos) << e.what();
  }
  EXPECT_EQ(codeOf([&] { device::copy(&b, &a, 4, nullptr); }), StatusCode::kInvalidUsage);
}

#ifdef TOPOCOLL_HAVE_CUDA

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

constexpr size_t kBig = (size_t{1} << 20) + 3;
constexpr int kSourcesMax = 8;
constexpr size_t kSlack = 96;       // bytes around each buffer: 48 before (guards), offsets < 16, 32 of guards after
constexpr size_t kGuardBytes = 32;  // either side of dst, checked untouched
constexpr uint8_t kGuard = 0xa5;

bool isNaN(DataType t, const uint8_t* p) {
  uint16_t h;
  switch (t) {
    case DataType::kFloat16:
      std::memcpy(&h, p, 2);
      return (h & 0x7fff) > 0x7c00;
    case DataType::kBfloat16:
      std::memcpy(&h, p, 2);
      return (h & 0x7fff) > 0x7f80;
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f != f;
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d != d;
    }
    case DataType::kFloat8e4m3:
      return (*p & 0x7f) == 0x7f;
    case DataType::kFloat8e5m2:
      return (*p & 0x7f) > 0x7c;
    default:
      return false;
  }
}

// A quarter random bit patterns (NaN, infinities, subnormals, extremes), the rest values in [-4, 4).
std::vector<uint8_t> makeSource(DataType t, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  size_t es = sizeOf(t);
  std::vector<uint8_t> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    uint64_t r = rng();
    uint8_t* p = out.data() + i * es;
    bool raw = t <= DataType::kUint64 || (rng() & 3) == 0;
    if (raw) {
      std::memcpy(p, &r, es);
      continue;
    }
    float f = value(rng);
    double d = f;
    uint16_t h;
    uint8_t c;
    switch (t) {
      case DataType::kFloat16:
        h = floatToHalf(f), std::memcpy(p, &h, 2);
        break;
      case DataType::kBfloat16:
        h = floatToBf16(f), std::memcpy(p, &h, 2);
        break;
      case DataType::kFloat32:
        std::memcpy(p, &f, 4);
        break;
      case DataType::kFloat64:
        d = d * (1 + 1e-9 * static_cast<double>(r >> 40)), std::memcpy(p, &d, 8);
        break;
      case DataType::kFloat8e4m3:
        c = floatToFp8e4m3(f), *p = c;
        break;
      default:
        c = floatToFp8e5m2(f), *p = c;
        break;
    }
  }
  return out;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(p) + kSlack / 2 + offset; }
};

enum class Layout { kAligned, kSameOffset, kMixedOffsets, kInPlace };
const char* to_string(Layout l) {
  switch (l) {
    case Layout::kAligned:
      return "aligned";
    case Layout::kSameOffset:
      return "same-offset";
    case Layout::kMixedOffsets:
      return "mixed-offsets";
    default:
      return "in-place";
  }
}

class DeviceReduce : public ::testing::TestWithParam<DataType> {
 protected:
  void SetUp() override {
    if (!device::available()) GTEST_SKIP() << cuda::unavailableReason();
  }
};

TEST_P(DeviceReduce, BitIdenticalToTheHost) {
  const DataType t = GetParam();
  const size_t es = sizeOf(t), bytes = kBig * es;
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  for (int s = 0; s < kSourcesMax; ++s) {
    host.push_back(makeSource(t, kBig, 1000 * static_cast<uint64_t>(t) + s));
    dev.push_back(std::make_unique<DeviceBuffer>(bytes + kSlack));
    ASSERT_NE(dev.back()->p, nullptr);
  }
  DeviceBuffer out(bytes + kSlack);
  ASSERT_NE(out.p, nullptr);
  std::vector<uint8_t> ref(bytes), got(bytes + 2 * kGuardBytes);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t nanOnly = 0;
  int wrongCases = 0;
  for (int o = 0; o < kNumRedOps; ++o) {
    const RedOp op = static_cast<RedOp>(o);
    for (int n : {1, 2, 3, 8}) {
      const int avg = op == RedOp::kAvg ? n : 0;
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, kBig}) {
        std::vector<const void*> hs;
        for (int s = 0; s < n; ++s) hs.push_back(host[s].data());
        reduceMany(t, op, ref.data(), hs.data(), n, count);
        if (avg > 0) finishAvg(t, ref.data(), count, avg);
        for (Layout layout : {Layout::kAligned, Layout::kSameOffset, Layout::kMixedOffsets, Layout::kInPlace}) {
          auto offset = [&](int which) -> size_t {  // which: source index, or -1 for dst
            if (layout == Layout::kSameOffset) return es == 8 ? 8 : 3 * es;
            if (layout == Layout::kMixedOffsets) return ((which + 2) * 5 * es) % 16;
            return 0;
          };
          std::vector<const void*> ds;
          for (int s = 0; s < n; ++s) {
            ds.push_back(dev[s]->at(offset(s)));
            CUDA_OK(cudaMemcpy(dev[s]->at(offset(s)), host[s].data(), count * es, cudaMemcpyHostToDevice));
          }
          CUDA_OK(cudaMemset(out.p, kGuard, bytes + kSlack));
          CUDA_OK(cudaDeviceSynchronize());  // the uploads and memset ran on the legacy stream, the reduce does not
          uint8_t* dst = layout == Layout::kInPlace ? dev[0]->at(0) : out.at(offset(-1));
          std::string what = fmt::format("{} {} n={} count={} {}", topocoll::to_string(t), topocoll::to_string(op), n,
                                         count, to_string(layout));
          ASSERT_NO_THROW(device::reduce(t, op, dst, ds.data(), n, count, avg, stream)) << what;
          CUDA_OK(cudaStreamSynchronize(stream));
          // The result and kGuardBytes either side, which must be untouched (the in-place dst has no guards).
          const size_t guard = layout == Layout::kInPlace ? 0 : kGuardBytes;
          CUDA_OK(cudaMemcpy(got.data(), dst - guard, count * es + 2 * guard, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < guard; ++i) {
            ASSERT_EQ(got[i], kGuard) << what << ": written " << guard - i << " bytes before dst";
            ASSERT_EQ(got[guard + count * es + i], kGuard) << what << ": written " << i + 1 << " bytes past the end";
          }
          const uint8_t* result = got.data() + guard;
          if (std::memcmp(result, ref.data(), count * es) == 0) continue;
          for (size_t i = 0; i < count; ++i) {
            const uint8_t *g = result + i * es, *r = ref.data() + i * es;
            if (std::memcmp(g, r, es) == 0) continue;
            if (isNaN(t, g) && isNaN(t, r)) {
              ++nanOnly;
              continue;
            }
            std::string in;
            for (int s = 0; s < n; ++s) {
              uint64_t v = 0;
              std::memcpy(&v, host[s].data() + i * es, es);
              in += fmt::format(" {:#x}", v);
            }
            uint64_t gv = 0, rv = 0;
            std::memcpy(&gv, g, es), std::memcpy(&rv, r, es);
            ADD_FAILURE() << what << ": element " << i << " GPU " << std::hex << gv << " host " << rv << ", inputs"
                          << in;
            ASSERT_LT(++wrongCases, 40) << "stopping";
            break;  // one element per case: the next cases say more
          }
        }
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
  RecordProperty("nan_pattern_differences", static_cast<int>(nanOnly));
}

std::string typeName(const ::testing::TestParamInfo<DataType>& info) { return topocoll::to_string(info.param); }
INSTANTIATE_TEST_SUITE_P(EveryType, DeviceReduce,
                         ::testing::Values(DataType::kInt8, DataType::kUint8, DataType::kInt32, DataType::kUint32,
                                           DataType::kInt64, DataType::kUint64, DataType::kFloat16, DataType::kFloat32,
                                           DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3,
                                           DataType::kFloat8e5m2),
                         typeName);

TEST(DeviceCopy, CopiesOnTheStream) {
  if (!device::available()) GTEST_SKIP() << cuda::unavailableReason();
  std::vector<uint8_t> in(1 << 20), back(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 3);
  DeviceBuffer a(in.size() + kSlack), b(in.size() + kSlack);
  ASSERT_TRUE(a.p && b.p);
  device::copy(a.at(0), in.data(), in.size(), nullptr);  // host to device (cudaMemcpyDefault)
  device::copy(b.at(1), a.at(0), in.size(), nullptr);
  device::copy(back.data(), b.at(1), in.size(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(in, back);
}

#endif  // TOPOCOLL_HAVE_CUDA

}  // namespace
}  // namespace topocoll::collectives
