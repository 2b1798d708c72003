// Collectives on device buffers (docs/gpu.md, "Device collectives"): host-orchestrated, CUDA-IPC-direct on the user's
// buffers. Several processes share one GPU on the machines this was built for, and kernels of different processes
// cannot wait on each other without MPS, so the host orders the phases:
//   1. cudaStreamSynchronize(the caller's stream, and the legacy default stream unless the caller's stream is
//      non-blocking): the collective comes after the work queued before it;
//   2. a host allGather of {IPC handle of the allocation holding each buffer, offset, pointer, pid} (the buffers'
//      peers are opened once, through a cache: cudaIpcOpenMemHandle costs milliseconds);
//   3. reductions and copies (collectives::device) on the caller's stream straight between the ranks' buffers, each
//      phase finished by a stream synchronize and a host barrier, so no rank overwrites what a peer still reads and
//      nobody returns while a peer still reads its buffers.
// Ranks on several hosts, TOPOCOLL_DEVICE_STAGED=1, or a buffer that cannot be exported (cudaMallocAsync pools, VMM)
// on any rank: the data goes through pinned host memory and the host collectives.
#include "topocoll/collectives/device_coll.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>

#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/status.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "topocoll/collectives/device.h"
#endif

namespace topocoll::collectives {

#ifdef TOPOCOLL_HAVE_CUDA
namespace {

namespace dev = device;

// dev::reduce over any number of sources: kMaxSources at a time, each later pass folding the partial result (its
// first source) with the next ones, so the order stays left to right; the average's division once, at the end.
void reduceAll(DataType type, RedOp op, void* dst, const void* const* srcs, int n, size_t count, int avg,
               void* stream) {
  int done = std::min(n, dev::kMaxSources);
  dev::reduce(type, op, dst, srcs, done, count, done == n ? avg : 0, stream);
  std::vector<const void*> more;
  while (done < n) {
    int take = std::min(n - done, dev::kMaxSources - 1);
    more.assign(1, dst);
    more.insert(more.end(), srcs + done, srcs + done + take);
    done += take;
    dev::reduce(type, op, dst, more.data(), take + 1, count, done == n ? avg : 0, stream);
  }
}

// A copy, nothing when in place (the rank's own block of an in-place AllGather, the root's in-place Broadcast).
void copyTo(void* dst, const void* src, size_t bytes, void* stream) {
  if (dst != src) dev::copy(dst, src, bytes, stream);
}

// The driver's calls the runtime lacks (the allocation's start, its unique id), through the runtime's entry points:
// no link to libcuda, so the binaries still load where there is no driver.
using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using PointerAttrFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);

template <typename F>
F driverCall(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  TC_CUDA(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess)
    fail(StatusCode::kSystemError, "the CUDA driver has no {} (query result {})", name, static_cast<int>(q));
  return reinterpret_cast<F>(fn);
}

// This process's exported allocations: allocation id -> handle (cudaIpcGetMemHandle costs ~100 us; ids are never
// reused within a process, so an entry never describes another allocation). Bounded: cleared when it grows large.
// The imports: a handle opened once per process however many communicators or ranks use it, closed with the last.
struct Registry {
  std::mutex mu;
  std::map<uint64_t, cudaIpcMemHandle_t> exported;
  struct Import {
    char* base;
    int refs;
  };
  std::map<std::string, Import> imported;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: communicators may outlive static destruction order
  return *r;
}

struct Export {
  bool ok = false;
  cudaIpcMemHandle_t handle{};
  uint64_t offset = 0;
};

Export exportOf(const void* p) {
  static const auto range = driverCall<AddressRangeFn>("cuMemGetAddressRange");
  static const auto attr = driverCall<PointerAttrFn>("cuPointerGetAttribute");
  Export e;
  CUdeviceptr base = 0;
  size_t size = 0;
  unsigned long long id = 0;
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  if (range(&base, &size, ptr) != CUDA_SUCCESS || attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS)
    return e;
  e.offset = ptr - base;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.exported.find(id);
  if (it == r.exported.end()) {
    cudaIpcMemHandle_t h{};
    if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)) != cudaSuccess) {
      (void)cudaGetLastError();
      TC_INFO(log::kColl, "device buffer {} cannot be exported through CUDA IPC: staging through host memory", p);
      return e;
    }
    if (r.exported.size() >= 4096) r.exported.clear();
    it = r.exported.emplace(id, h).first;
  }
  e.handle = it->second;
  e.ok = true;
  return e;
}

struct Rec {
  cudaIpcMemHandle_t send, recv;
  uint64_t sendOff, recvOff, sendPtr, recvPtr;
  int64_t pid;
  int32_t ok, pad;
  char uuid[16];  // the GPU holding the buffers
};
static_assert(sizeof(Rec) == 2 * sizeof(cudaIpcMemHandle_t) + 5 * 8 + 2 * 4 + 16, "Rec is sent as bytes: no padding");

// The UUID of the GPU holding `p` (cudaGetDeviceProperties is slow: once per device ordinal).
void deviceUuid(const void* p, char* out) {
  static std::mutex mu;
  static std::map<int, std::array<char, 16>> known;
  cudaPointerAttributes a{};
  TC_CUDA(cudaPointerGetAttributes(&a, p));
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(a.device);
  if (it == known.end()) {
    cudaDeviceProp prop{};
    TC_CUDA(cudaGetDeviceProperties(&prop, a.device));
    std::array<char, 16> u{};
    std::memcpy(u.data(), &prop.uuid, 16);
    it = known.emplace(a.device, u).first;
  }
  std::memcpy(out, it->second.data(), 16);
}

// Slice `i` of `count` elements over `n` ranks: 256-byte aligned starts (the kernels' vector loads), the last short.
struct Slice {
  size_t begin, len;
};
Slice slice(size_t count, size_t es, int n, int i) {
  size_t align = std::max<size_t>(1, 256 / es);
  size_t per = (count + n - 1) / n;
  per = (per + align - 1) / align * align;
  size_t b = std::min(count, per * i), e = std::min(count, per * (i + 1));
  return {b, e - b};
}

}  // namespace

DeviceColl::~DeviceColl() {
  auto& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& o : lru_) {
      auto it = r.imported.find(o.key);
      if (it != r.imported.end() && --it->second.refs == 0) {
        if (cudaIpcCloseMemHandle(it->second.base) != cudaSuccess) (void)cudaGetLastError();
        r.imported.erase(it);
      }
    }
  }
  lru_.clear();
  byKey_.clear();
  for (auto* h : host_)
    if (h && cudaFreeHost(h) != cudaSuccess) (void)cudaGetLastError();
  if (scratch_ && cudaFree(scratch_) != cudaSuccess) (void)cudaGetLastError();
}

char* DeviceColl::open(int peer, const void* handle) {
  std::string key(static_cast<const char*>(handle), sizeof(cudaIpcMemHandle_t));
  auto found = byKey_.find(key);
  if (found != byKey_.end()) {
    found->second->lastCall = calls_;
    lru_.splice(lru_.begin(), lru_, found->second);
    return found->second->base;
  }
  auto& r = registry();
  char* base = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.imported.find(key);
    if (it == r.imported.end()) {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, handle, sizeof(h));
      void* p = nullptr;
      cudaError_t rc = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        fail(StatusCode::kSystemError, "cudaIpcOpenMemHandle of rank {}'s buffer failed: {}: {}", peer,
             cudaGetErrorName(rc), cudaGetErrorString(rc));
      }
      it = r.imported.emplace(key, Registry::Import{static_cast<char*>(p), 0}).first;
      TC_TRACE(log::kColl, "opened rank {}'s device allocation at {}", peer, p);
    }
    ++it->second.refs;
    base = it->second.base;
  }
  lru_.push_front({key, base, calls_});
  byKey_[key] = lru_.begin();
  return base;
}

void DeviceColl::trim() {
  const size_t bound = static_cast<size_t>(h_.config().deviceIpcCache);
  auto& r = registry();
  while (lru_.size() > bound && lru_.back().lastCall != calls_) {
    Open& o = lru_.back();
    {
      std::lock_guard<std::mutex> lock(r.mu);
      auto it = r.imported.find(o.key);
      if (it != r.imported.end() && --it->second.refs == 0) {
        if (cudaIpcCloseMemHandle(it->second.base) != cudaSuccess) (void)cudaGetLastError();
        r.imported.erase(it);
      }
    }
    byKey_.erase(o.key);
    lru_.pop_back();
  }
}

bool DeviceColl::exchange(const void* send, const void* recv, Views* v, bool* oneGpu) {
  const int n = h_.nRanks(), me = h_.rank();
  ++calls_;
  Rec mine{};
  mine.pid = static_cast<int64_t>(::getpid());
  mine.ok = 1;
  mine.sendPtr = reinterpret_cast<uint64_t>(send);
  mine.recvPtr = reinterpret_cast<uint64_t>(recv);
  if (send) {
    Export e = exportOf(send);
    mine.ok &= e.ok;
    mine.send = e.handle;
    mine.sendOff = e.offset;
  }
  if (recv) {
    Export e = exportOf(recv);
    mine.ok &= e.ok;
    mine.recv = e.handle;
    mine.recvOff = e.offset;
  }
  deviceUuid(send ? send : recv, mine.uuid);
  std::vector<Rec> all(n);
  all[me] = mine;
  h_.hostRun(
      {.coll = Coll::kAllGather, .send = &all[me], .recv = all.data(), .count = sizeof(Rec), .type = DataType::kUint8});
  *oneGpu = true;
  for (const Rec& r : all) {
    if (!r.ok) return false;
    *oneGpu = *oneGpu && std::memcmp(r.uuid, mine.uuid, 16) == 0;
  }
  v->send.assign(n, nullptr);
  v->recv.assign(n, nullptr);
  for (int q = 0; q < n; ++q) {
    const Rec& r = all[q];
    const bool direct = q == me || r.pid == mine.pid;  // this process: the pointers as they are
    if (r.sendPtr) v->send[q] = direct ? reinterpret_cast<const char*>(r.sendPtr) : open(q, &r.send) + r.sendOff;
    if (r.recvPtr) v->recv[q] = direct ? reinterpret_cast<char*>(r.recvPtr) : open(q, &r.recv) + r.recvOff;
  }
  trim();
  return true;
}

void* DeviceColl::hostBuf(int i, size_t bytes) {
  if (bytes > hostBytes_[i]) {
    if (host_[i]) TC_CUDA(cudaFreeHost(host_[i]));
    host_[i] = nullptr;
    hostBytes_[i] = 0;
    TC_CUDA(cudaHostAlloc(&host_[i], bytes, cudaHostAllocDefault));
    hostBytes_[i] = bytes;
  }
  return host_[i];
}

char* DeviceColl::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    if (scratch_) TC_CUDA(cudaFree(scratch_));
    scratch_ = nullptr;
    scratchBytes_ = 0;
    TC_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch_), bytes));
    scratchBytes_ = bytes;
  }
  return scratch_;
}

void DeviceColl::staged(const Args& a) {
  const int n = h_.nRanks(), me = h_.rank();
  const size_t es = sizeOf(a.type), bytes = a.count * es;
  size_t inBytes = bytes, outBytes = bytes;
  if (a.coll == Coll::kAllGather) outBytes = bytes * n;
  if (a.coll == Coll::kReduceScatter) inBytes = bytes * n;
  const bool hasIn = !(a.coll == Coll::kBroadcast && me != a.root);
  const bool hasOut = !(a.coll == Coll::kReduce && me != a.root);
  auto st = static_cast<cudaStream_t>(a.stream);
  void* in = hostBuf(0, inBytes);
  void* out = hostBuf(1, outBytes);
  if (hasIn) TC_CUDA(cudaMemcpyAsync(in, a.send, inBytes, cudaMemcpyDefault, st));
  TC_CUDA(cudaStreamSynchronize(st));
  Args host = a;
  host.send = in;
  host.recv = out;
  host.stream = nullptr;
  h_.hostRun(host);
  if (hasOut) TC_CUDA(cudaMemcpyAsync(a.recv, out, outBytes, cudaMemcpyDefault, st));
  TC_CUDA(cudaStreamSynchronize(st));
}

void DeviceColl::run(const Args& a) {
  auto st = static_cast<cudaStream_t>(a.stream);
  cuda::waitForCaller(st);  // see cuda.h: the legacy stream too, unless st is non-blocking
  if (a.count == 0) return;
  const Config& cfg = h_.config();
  if (h_.nNodes() > 1 || cfg.deviceStaged) return staged(a);
  const int n = h_.nRanks(), me = h_.rank();
  const size_t es = sizeOf(a.type), bytes = a.count * es;
  const int avg = a.op == RedOp::kAvg ? n : 0;
  const bool rooted = a.coll == Coll::kBroadcast || a.coll == Coll::kReduce;
  const void* send = rooted && a.coll == Coll::kBroadcast && me != a.root ? nullptr : a.send;
  void* recv = a.coll == Coll::kReduce && me != a.root ? nullptr : a.recv;
  const bool oneShot = a.coll == Coll::kAllReduce && a.send != a.recv && cfg.deviceOneShotMax >= 0 &&
                       bytes <= static_cast<size_t>(cfg.deviceOneShotMax);
  Views v;
  bool oneGpu = false;
  if (!exchange(send, recv, &v, &oneGpu)) return staged(a);
  std::vector<const void*> srcs(n);
  auto finish = [&] {  // the phase is complete on this rank, then on every rank
    TC_CUDA(cudaStreamSynchronize(st));
    h_.barrier();
  };
  if (oneGpu && cfg.deviceLeader) {  // one GPU: rank 0 moves everything, the others wait for it
    if (me == 0) leader(a, v, st);
    finish();
    return;
  }
  switch (a.coll) {
    case Coll::kAllReduce:
      if (oneShot) {
        for (int q = 0; q < n; ++q) srcs[q] = v.send[q];
        reduceAll(a.type, a.op, a.recv, srcs.data(), n, a.count, avg, st);
        finish();
      } else {
        Slice s = slice(a.count, es, n, me);
        if (s.len) {
          for (int q = 0; q < n; ++q) srcs[q] = v.send[q] + s.begin * es;
          reduceAll(a.type, a.op, static_cast<char*>(a.recv) + s.begin * es, srcs.data(), n, s.len, avg, st);
        }
        finish();  // every slice reduced: the peers' outputs hold them, and nobody reads an input any more
        for (int q = 0; q < n; ++q) {
          Slice t = slice(a.count, es, n, q);
          if (q != me && t.len)
            copyTo(static_cast<char*>(a.recv) + t.begin * es, v.recv[q] + t.begin * es, t.len * es, st);
        }
        finish();
      }
      break;
    case Coll::kReduceScatter:
      for (int q = 0; q < n; ++q) srcs[q] = v.send[q] + static_cast<size_t>(me) * bytes;
      reduceAll(a.type, a.op, a.recv, srcs.data(), n, a.count, avg, st);
      finish();
      break;
    case Coll::kAllGather:
      for (int q = 0; q < n; ++q)
        copyTo(static_cast<char*>(a.recv) + static_cast<size_t>(q) * bytes, v.send[q], bytes, st);
      finish();
      break;
    case Coll::kBroadcast:
      copyTo(a.recv, v.send[a.root], bytes, st);
      finish();
      break;
    case Coll::kReduce:
      if (me == a.root) {
        for (int q = 0; q < n; ++q) srcs[q] = v.send[q];
        reduceAll(a.type, a.op, a.recv, srcs.data(), n, a.count, avg, st);
      }
      finish();
      break;
  }
}

// Every rank's buffers are on this one GPU: rank 0 does the whole collective (the same bytes read and written as the
// ranks' shares together, in one process's kernels: no switching between the ranks' contexts). Stream order keeps
// in-place cases safe: each output is written after the inputs it overwrites were read (AllReduce reduces before it
// copies; the other collectives read each input element before anything writes it or never overwrite it).
void DeviceColl::leader(const Args& a, const Views& v, void* stream) {
  const int n = h_.nRanks();
  const size_t es = sizeOf(a.type), bytes = a.count * es;
  const int avg = a.op == RedOp::kAvg ? n : 0;
  std::vector<const void*> srcs(n);
  switch (a.coll) {
    case Coll::kAllReduce:
      for (int q = 0; q < n; ++q) srcs[q] = v.send[q];
      reduceAll(a.type, a.op, v.recv[0], srcs.data(), n, a.count, avg, stream);
      for (int q = 1; q < n; ++q) copyTo(v.recv[q], v.recv[0], bytes, stream);
      break;
    case Coll::kReduceScatter:
      for (int p = 0; p < n; ++p) {
        for (int q = 0; q < n; ++q) srcs[q] = v.send[q] + static_cast<size_t>(p) * bytes;
        reduceAll(a.type, a.op, v.recv[p], srcs.data(), n, a.count, avg, stream);
      }
      break;
    case Coll::kAllGather:
      for (int p = 0; p < n; ++p)
        for (int q = 0; q < n; ++q) copyTo(v.recv[p] + static_cast<size_t>(q) * bytes, v.send[q], bytes, stream);
      break;
    case Coll::kBroadcast:
      for (int p = 0; p < n; ++p) copyTo(v.recv[p], v.send[a.root], bytes, stream);
      break;
    case Coll::kReduce:
      for (int q = 0; q < n; ++q) srcs[q] = v.send[q];
      reduceAll(a.type, a.op, v.recv[a.root], srcs.data(), n, a.count, avg, stream);
      break;
  }
}

void DeviceColl::stagedAllToAll(const void* send, void* recv, size_t count, DataType type, void* stream) {
  const size_t total = count * sizeOf(type) * h_.nRanks();
  auto st = static_cast<cudaStream_t>(stream);
  void* in = hostBuf(0, total);
  void* out = hostBuf(1, total);
  TC_CUDA(cudaMemcpyAsync(in, send, total, cudaMemcpyDefault, st));
  TC_CUDA(cudaStreamSynchronize(st));
  h_.hostAllToAll(in, out, count, type);
  TC_CUDA(cudaMemcpyAsync(recv, out, total, cudaMemcpyDefault, st));
  TC_CUDA(cudaStreamSynchronize(st));
}

void DeviceColl::allToAll(const void* send, void* recv, size_t count, DataType type, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  cuda::waitForCaller(st);  // see cuda.h: the legacy stream too, unless st is non-blocking
  if (count == 0) return;
  if (h_.nNodes() > 1 || h_.config().deviceStaged) return stagedAllToAll(send, recv, count, type, stream);
  const int n = h_.nRanks(), me = h_.rank();
  const size_t bytes = count * sizeOf(type), total = bytes * n;
  const char* s = static_cast<const char*>(send);
  const char* r = static_cast<const char*>(recv);
  if (s < r + total && r < s + total) {  // overlapping: a peer would read blocks this rank overwrites
    char* copy = scratch(total);
    copyTo(copy, send, total, st);
    TC_CUDA(cudaStreamSynchronize(st));
    s = copy;
  }
  Views v;
  bool oneGpu = false;
  if (!exchange(s, recv, &v, &oneGpu)) return stagedAllToAll(send, recv, count, type, stream);
  if (oneGpu && h_.config().deviceLeader) {  // rank 0 moves every block (see leader())
    if (me == 0)
      for (int p = 0; p < n; ++p)
        for (int q = 0; q < n; ++q)
          copyTo(v.recv[p] + static_cast<size_t>(q) * bytes, v.send[q] + static_cast<size_t>(p) * bytes, bytes, st);
  } else {
    for (int q = 0; q < n; ++q)
      copyTo(static_cast<char*>(recv) + static_cast<size_t>(q) * bytes, v.send[q] + static_cast<size_t>(me) * bytes,
             bytes, st);
  }
  TC_CUDA(cudaStreamSynchronize(st));
  h_.barrier();
}

#else  // no CUDA: no buffer is ever device memory (cuda::locate), so none of this runs

DeviceColl::~DeviceColl() {
  (void)h_, (void)calls_, (void)host_, (void)hostBytes_, (void)scratch_, (void)scratchBytes_;
}
void DeviceColl::run(const Args&) { fail(StatusCode::kInvalidUsage, "built without CUDA"); }
void DeviceColl::allToAll(const void*, void*, size_t, DataType, void*) {
  fail(StatusCode::kInvalidUsage, "built without CUDA");
}

#endif

}  // namespace topocoll::collectives
