#include "topocoll/mapped_region.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "topocoll/status.h"

namespace topocoll {

MappedRegion MappedRegion::shared(int fd, size_t size, const char* what) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    fail(StatusCode::kSystemError, "mmap of {} shared bytes ({}): {}", size, what, std::strerror(errno));
  return MappedRegion(p, size);
}

MappedRegion MappedRegion::anonymous(size_t size, const char* what) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail(StatusCode::kSystemError, "mmap of {} bytes ({}): {}", size, what, std::strerror(errno));
  return MappedRegion(p, size);
}

void MappedRegion::reset() {
  if (ptr_) ::munmap(ptr_, size_);
  ptr_ = nullptr;
  size_ = 0;
}

}  // namespace topocoll
