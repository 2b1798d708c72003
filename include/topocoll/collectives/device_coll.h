// Collectives on device buffers (docs/gpu.md, "Device collectives"). On one host the ranks read each other's buffers
// through CUDA IPC, orchestrated from the host: each call exchanges the IPC handles of the buffers' allocations over
// the host collectives, opens the peers' through a cache, reduces and copies with collectives::device on the
// caller's stream and separates the phases with host barriers. Across hosts (or with TOPOCOLL_DEVICE_STAGED=1, or
// when a buffer cannot be exported) the data goes through pinned host memory and the host collectives.
//
// The algorithm sees its communicator only through DeviceHost (the runtime implements it over the communicator's
// host-memory collectives), as the host algorithms see it only through progress::Links:
//
//   collectives::DeviceColl dc(host);   // host: a DeviceHost that outlives dc
//   dc.run(a);                          // a.send / a.recv device memory, a.stream the caller's cudaStream_t
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "topocoll/collectives/algorithms.h"
#include "topocoll/config.h"
#include "topocoll/datatype.h"

namespace topocoll::collectives {

/// What the device path needs from its communicator. Every call is collective except the accessors: every rank
/// makes the same calls in the same order, and a failure throws Error.
class DeviceHost {
 public:
  virtual ~DeviceHost() = default;
  virtual int rank() const = 0;
  virtual int nRanks() const = 0;
  /// Hosts the ranks span: more than one stages every call through host memory.
  virtual int nNodes() const = 0;
  /// The knobs read here: deviceStaged, deviceLeader, deviceOneShotMax, deviceIpcCache.
  virtual const Config& config() const = 0;
  virtual void barrier() = 0;
  /// The blocking collective `a` on host buffers (a.stream is not used).
  virtual void hostRun(const Args& a) = 0;
  /// The blocking AllToAll on host buffers.
  virtual void hostAllToAll(const void* send, void* recv, size_t count, DataType type) = 0;
};

class DeviceColl {
 public:
  explicit DeviceColl(DeviceHost& h) : h_(h) {}
  /// Closes every peer allocation this communicator opened (cudaIpcCloseMemHandle), frees its own buffers.
  ~DeviceColl();
  DeviceColl(const DeviceColl&) = delete;
  DeviceColl& operator=(const DeviceColl&) = delete;

  /// The collective `a` on device buffers, ordered after the work queued on a.stream; done when it returns. Without
  /// CUDA: throws kInvalidUsage.
  void run(const Args& a);
  void allToAll(const void* send, void* recv, size_t count, DataType type, void* stream);
  /// Peers' allocations mapped now (tests).
  size_t mapped() const { return lru_.size(); }

 private:
  struct Views {  // each rank's send and receive buffers as this rank reaches them
    std::vector<const char*> send;
    std::vector<char*> recv;
  };
  /// Exchanges the buffers (the first host collective of a call); false when some rank could not export one: then
  /// every rank stages the call through host memory.
  bool exchange(const void* send, const void* recv, Views* v, bool* oneGpu);
  /// Rank 0's whole collective when every rank's buffers are on one GPU (TOPOCOLL_DEVICE_LEADER).
  void leader(const Args& a, const Views& v, void* stream);
  char* open(int peer, const void* handle);
  void trim();
  void staged(const Args& a);
  void stagedAllToAll(const void* send, void* recv, size_t count, DataType type, void* stream);
  void* hostBuf(int i, size_t bytes);
  char* scratch(size_t bytes);

  DeviceHost& h_;
  uint64_t calls_ = 0;
  // The peer allocations opened by this communicator, most recently used first: key = the handle's bytes.
  struct Open {
    std::string key;
    char* base;
    uint64_t lastCall;
  };
  std::list<Open> lru_;
  std::map<std::string, std::list<Open>::iterator> byKey_;
  void* host_[2] = {nullptr, nullptr};  // pinned staging buffers
  size_t hostBytes_[2] = {0, 0};
  char* scratch_ = nullptr;  // a device copy of an in-place AllToAll's input
  size_t scratchBytes_ = 0;
};

}  // namespace topocoll::collectives
