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

/// Installs the allocator as PyTorch's CPU allocator when `enable` (TOPOCOLL_TORCH_HUGEPAGES, or PyTorch's
/// THP_MEM_ALLOC_ENABLE when that is unset) is 1; idempotent. Returns whether it is installed.
bool installCpuAllocator(bool enable);

/// Called with every tensor a collective is given: once the same 2 MiB-aligned interior (of a tensor of at least
/// kCollapseMin bytes that this allocator did not make: made before the import, from_blob, another allocator) has
/// been used kCollapseAfter times, it is madvise(MADV_HUGEPAGE)d and madvise(MADV_COLLAPSE)d, once, on the calling
/// thread: the kernel moves it onto 2 MiB pages now rather than never. Nothing when the allocator is not installed.
void noteTensorUse(const void* data, std::size_t bytes);

struct CpuAllocatorStats {
  bool installed = false;
  std::uint64_t collapses = 0;      // MADV_COLLAPSE calls made by noteTensorUse
  std::uint64_t collapsesOk = 0;    // ... that succeeded
  std::uint64_t hugeAllocs = 0;  // allocations made 2 MiB-aligned with MADV_HUGEPAGE since installation
  std::uint64_t hugeFrees = 0;   // ... and freed
  std::uint64_t hugeBytes = 0;   // bytes of those still live
};
CpuAllocatorStats cpuAllocatorStats();

/// Bytes from which allocations are 2 MiB-aligned and advised huge (2 MiB).
inline constexpr std::size_t kHugeAllocMin = std::size_t(2) << 20;
/// Tensors from this size on that are not on huge pages get their interior collapsed after kCollapseAfter uses.
inline constexpr std::size_t kCollapseMin = std::size_t(4) << 20;
inline constexpr int kCollapseAfter = 3;

}  // namespace topocoll::torch_backend
