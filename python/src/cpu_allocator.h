// The CPU allocator the backend installs for PyTorch (c10::SetCPUAllocator), as PyTorch 2.x does under
// THP_MEM_ALLOC_ENABLE=1: allocations from 2 MiB up start on a 2 MiB boundary and are madvise(MADV_HUGEPAGE)d, so
// that the kernel backs them with transparent huge pages (this kernel's THP mode is "madvise": malloc'd memory
// otherwise stays on 4 KiB pages). Every rank that pulls such a tensor with process_vm_readv then pins one 2 MiB
// page where it pinned 512 small ones. Smaller allocations are c10's own (c10::alloc_cpu). Every block is freed
// with c10::free_cpu (free()), whichever path made it, so tensors allocated before the allocator was installed, or
// by it and freed after it was replaced, free correctly. Large tensors it did not make (made before the import, or
// by another allocator) are moved onto 2 MiB pages with MADV_COLLAPSE once they have been used a few times.
#pragma once

#include <cstddef>
#include <cstdint>

namespace topocoll::torch_backend {

/// Installs the allocator as PyTorch's CPU allocator when `hugePages` (TOPOCOLL_TORCH_HUGEPAGES, or PyTorch's
/// THP_MEM_ALLOC_ENABLE when that is unset) or `shareable` (TOPOCOLL_TORCH_SHAREABLE) is 1; idempotent (a later
/// call may turn shareable on). Returns whether it is installed. With `shareable`, blocks from kShareMin come
/// from transport::allocShareable (memfd memory that the peers map: the collectives' mapped single copies and
/// mapped inputs work on such tensors as on ncclMemAlloc's buffers), OnFork::kCopied (a forked child gets private
/// copies), and freed ones are kept for reuse up to kShareCacheMax bytes (PyTorch frees and allocates the same
/// sizes over and over: no memfd_create, mmap and page faults each time).
bool installCpuAllocator(bool hugePages, bool shareable = false);

/// Called with every tensor a collective is given: once the same 2 MiB-aligned interior (of a tensor of at least
/// kCollapseMin bytes that this allocator did not make: made before the import, from_blob, another allocator) has
/// been used kCollapseAfter times, it is madvise(MADV_HUGEPAGE)d and madvise(MADV_COLLAPSE)d, once, on the calling
/// thread: the kernel moves it onto 2 MiB pages now rather than never. Nothing when the allocator is not installed.
void noteTensorUse(const void* data, std::size_t bytes);

/// Before an operation uses tensor bytes [data, data + bytes) whose storage is [base, base + storageBytes): when
/// the tensor covers the whole of a shareable block that a fork() turned private (transport::peer_memory.h,
/// OnFork::kCopied), makes it shareable again (transport::reshare: one copy of the block). Called on the thread
/// that runs the operation, which owns those bytes until it ends. Nothing otherwise.
void reshareWholeBlock(const void* base, std::size_t storageBytes, const void* data, std::size_t bytes);

struct CpuAllocatorStats {
  bool installed = false;
  bool hugePages = false;           // huge-page blocks on (TOPOCOLL_TORCH_HUGEPAGES=1, use_huge_pages())
  std::uint64_t collapses = 0;      // MADV_COLLAPSE calls made by noteTensorUse
  std::uint64_t collapsesOk = 0;    // ... that succeeded
  std::uint64_t hugeAllocs = 0;  // allocations made 2 MiB-aligned with MADV_HUGEPAGE since installation
  std::uint64_t hugeFrees = 0;   // ... and freed
  std::uint64_t hugeBytes = 0;   // bytes of those still live
  bool shareable = false;          // TOPOCOLL_TORCH_SHAREABLE=1
  std::uint64_t shareAllocs = 0;   // shareable blocks made
  std::uint64_t shareReuses = 0;   // ... allocations served from freed ones
  std::uint64_t shareLive = 0;     // shareable blocks live now
  std::uint64_t shareCachedBytes = 0;  // freed ones kept
  std::uint64_t shareReshared = 0;     // blocks made shareable again after a fork() (reshareWholeBlock)
};
CpuAllocatorStats cpuAllocatorStats();

/// Bytes from which allocations are 2 MiB-aligned and advised huge (2 MiB).
inline constexpr std::size_t kHugeAllocMin = std::size_t(2) << 20;
/// Bytes from which allocations are shareable when that is on (1 MiB: issue 12's sizes start there; below 2 MiB
/// they are rounded to 64 KiB, transport::shareableLength).
inline constexpr std::size_t kShareMin = std::size_t(1) << 20;
/// Tensors from this size on that are not on huge pages get their interior collapsed after kCollapseAfter uses.
inline constexpr std::size_t kCollapseMin = std::size_t(4) << 20;
inline constexpr int kCollapseAfter = 3;
/// Freed shareable blocks kept for reuse, at most this many bytes.
inline constexpr std::size_t kShareCacheMax = std::size_t(256) << 20;

}  // namespace topocoll::torch_backend
