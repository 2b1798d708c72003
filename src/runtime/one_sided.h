// Registered buffers, memory windows and one-sided signals of a communicator (NCCL's ncclCommRegister,
// ncclCommWindowRegister, ncclPutSignal, ncclSignal, ncclWaitSignal) for host memory. CommImpl owns one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "topocoll/runtime/communicator.h"

namespace topocoll::transport {
class PeerMapping;
}

namespace topocoll::runtime {

class CommImpl;

/// A window as its handle points to it (opaque to users).
class Window {
 public:
  uint32_t id = 0;      // its registration's number in the communicator
  void* user = nullptr; // this rank's buffer
  size_t bytes = 0;
  int flags = 0;
  std::vector<char*> peerBase;     // each rank's buffer here (nullptr: not mapped here)
  std::vector<uint64_t> peerBytes; // each rank's size
  std::vector<std::string> unmapped;  // why rank q's buffer is not mapped here
  std::vector<std::shared_ptr<const transport::PeerMapping>> holds;
};

namespace detail {

struct WindowNote;
struct NoteRegion;

class OneSided {
 public:
  explicit OneSided(CommImpl& comm);
  ~OneSided();

  void* registerBuffer(void* buf, size_t bytes);
  void deregisterBuffer(void* handle);
  size_t registeredBytes() const;

  Window* registerWindow(void* buf, size_t bytes, int flags);
  void deregisterWindow(Window* w);
  void* userPtr(Window* w) const;

  void putSignal(const void* local, size_t bytes, int peer, Window* w, size_t offset);
  void signal(int peer);
  void waitSignals(const std::vector<Communicator::SignalWait>& waits);

 private:
  struct Registration {
    uintptr_t base = 0;
    size_t bytes = 0;
  };
  Window* live(Window* w, const char* what) const;  // w, checked: one of this communicator's windows
  char* peerSignals(int peer, const char* what) const;
  void mapSignals(const std::vector<WindowNote>& notes);
  char* mapPart(int q, const NoteRegion& r, const char* what,
                std::shared_ptr<const transport::PeerMapping>* hold, std::string* why) const;

  CommImpl& c_;
  mutable std::mutex mu_;
  std::map<uintptr_t, std::unique_ptr<Registration>> regs_;  // by base address
  std::set<Window*> windows_;
  uint32_t windowSeq_ = 0;
  void* signals_ = nullptr;  // this rank's SignalBlock (allocShareable)
  std::vector<char*> peerSignals_;  // each rank's block here (nullptr: not mapped)
  std::vector<std::string> signalsUnmapped_;
  std::vector<std::shared_ptr<const transport::PeerMapping>> signalHolds_;
  std::mutex waitMu_;               // one wait at a time (consumed_)
  std::vector<uint64_t> consumed_;  // signals of rank q that waits took (under waitMu_)
};

}  // namespace detail
}  // namespace topocoll::runtime
