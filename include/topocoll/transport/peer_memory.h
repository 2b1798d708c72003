// Shareable host buffers and the peers' views of them (NCCL's user-buffer registration for host memory, our own
// design). allocShareable gives memory backed by a memfd and records it; a single copy whose passive side's buffer
// lies in such memory names it in the rendezvous (RegionRef), and the active side imports the memfd with
// pidfd_getfd (the same permission process_vm_readv needs), maps it once per buffer and copies with loads and
// stores. Where any of that fails the copy goes through process_vm_readv/writev as before.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>

#include "topocoll/mapped_region.h"
#include "topocoll/transport/transport.h"

namespace topocoll::transport {

/// `bytes` of zeroed memory backed by a memfd (rounded up to shareableLength(bytes)), recorded for regionOf; anonymous memory where
/// memfd_create fails or the process is near its descriptor limit (each buffer holds one descriptor, moved above
/// 1023 where the limit allows, for select() users). Throws kSystemError when no memory can be had,
/// kInvalidArgument above 2^50 bytes. Never nullptr for bytes > 0. The memory is MAP_SHARED: with OnFork::kShared
/// (runtime::memAlloc, ncclMemAlloc) a child forked after the allocation shares it with its parent; with
/// OnFork::kCopied (PyTorch's tensors, whose users expect fork() to copy them) parent and child each keep the bytes
/// of the moment of fork() and neither sees the other's later writes, as with anonymous memory. fork() does that in
/// its atfork handlers in one of two ways: while no peer access is in flight (notePeerAccess) the parent's buffer
/// becomes a private copy-on-write mapping of the same memory (nothing is copied; the buffer is no longer shareable
/// in the parent either, until reshare()); otherwise the child copies every such buffer at once and the parent
/// waits for it (its buffers stay shareable: a peer may be writing into them). In the child the buffer is no longer
/// shareable. A child that cannot map its copy aborts.
enum class OnFork { kShared, kCopied };
/// The length allocShareable gives `bytes`: whole 2 MiB (huge) pages from 2 MiB, whole 64 KiB below.
inline size_t shareableLength(size_t bytes) {
  const size_t align = bytes >= (size_t{2} << 20) ? (size_t{2} << 20) : (size_t{64} << 10);
  return (bytes + align - 1) & ~(align - 1);
}
void* allocShareable(size_t bytes, OnFork onFork = OnFork::kShared);
/// Frees what allocShareable returned (nullptr: nothing). Throws kInvalidUsage for a pointer it did not return.
void freeShareable(void* p);
/// Whether the bytes of buffer `p` (allocShareable's) are dead (a caching allocator's freed block): a forked child
/// then gets fresh memory there instead of a copy (OnFork::kCopied). Nothing for other pointers.
void markUnused(void* p, bool unused);
/// Counts operations in flight that may let peers read or write this process's OnFork::kCopied buffers (the PyTorch
/// backend: +1 when it queues one, -1 when it ended): fork() copies eagerly while the count is not zero.
void notePeerAccess(int delta);
/// Makes the kCopied buffer at `p` (allocShareable's address) shareable again after a fork() turned it private: a
/// fresh memfd takes its bytes (one copy) and replaces the private mapping at the same address. The caller owns
/// every byte of the buffer meanwhile (nothing else may write it during the copy). Returns whether the buffer is
/// shareable now (false: not allocShareable's, or no memfd could be had; the buffer is unchanged). `copied` (when
/// given): whether this call made the copy (false for a buffer that was shareable already).
bool reshare(void* p, bool* copied = nullptr);
/// The shareable buffer holding [p, p + n), or a RegionRef with fd < 0.
RegionRef regionOf(const void* p, size_t n);

/// A peer's shareable buffer mapped here; unmapped when the last holder lets go.
class PeerMapping {
 public:
  PeerMapping(MappedRegion view, const RegionRef& r) : view_(std::move(view)), ref_(r) {}
  /// The local address of the owner's address `remote` (mapPeerRegion checked the range).
  char* at(const RegionRef& r, uint64_t remote) const { return view_.data() + (remote - r.base); }
  /// The buffer as its owner described it when it was mapped.
  const RegionRef& ref() const { return ref_; }

 private:
  MappedRegion view_;
  RegionRef ref_;
};

/// This process's view of `r`, a buffer of process `pid`, mapped on first use and cached (a bounded number of
/// buffers; dropping one from the cache unmaps it once no copy holds it). nullptr when the range [remote, remote +
/// n) is not inside r, or the import fails (no permission, the process is gone, the descriptor is not that
/// buffer's memfd): the caller copies with process_vm_readv/writev; a failed import is not retried for that buffer.
std::shared_ptr<const PeerMapping> mapPeerRegion(pid_t pid, const RegionRef& r, uint64_t remote, size_t n);

/// Mappings cached now (tests).
size_t peerMappingsCached();

}  // namespace topocoll::transport
