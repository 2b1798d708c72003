// Collectives on device buffers (runtime private; docs/gpu.md, "Device collectives"). On one host the ranks read each
// other's buffers through CUDA IPC, orchestrated from the host: each call exchanges the IPC handles of the buffers'
// allocations over the host collectives, opens the peers' through a cache, reduces and copies with
// collectives::device on the caller's stream and separates the phases with host barriers. Across hosts (or with
// TOPOCOLL_DEVICE_STAGED=1, or when a buffer cannot be exported) the data goes through pinned host memory and the
// host collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "topocoll/collectives/algorithms.h"
#include "topocoll/datatype.h"

namespace topocoll::runtime {
class CommImpl;
}

namespace topocoll::runtime::detail {

class DeviceColl {
 public:
  explicit DeviceColl(CommImpl& c) : c_(c) {}
  /// Closes every peer allocation this communicator opened (cudaIpcCloseMemHandle), frees its own buffers.
  ~DeviceColl();
  DeviceColl(const DeviceColl&) = delete;
  DeviceColl& operator=(const DeviceColl&) = delete;

  void run(const collectives::Args& a);
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
  void leader(const collectives::Args& a, const Views& v, void* stream);
  char* open(int peer, const void* handle);
  void trim();
  void barrier();
  void staged(const collectives::Args& a);
  void stagedAllToAll(const void* send, void* recv, size_t count, DataType type, void* stream);
  void* hostBuf(int i, size_t bytes);
  char* scratch(size_t bytes);

  CommImpl& c_;
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

}  // namespace topocoll::runtime::detail
