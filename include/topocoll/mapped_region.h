// Memory from mmap with one owner: unmapped when the owner goes, movable, not copyable (the mapping counterpart of
// unique_fd.h). Every mapping the library makes and keeps is one of these.
//
//   MappedRegion shared = MappedRegion::shared(fd, bytes, "the peer's FIFO");   // throws naming what on failure
//   MappedRegion fifo = MappedRegion::anonymous(bytes, "NET FIFO");
//   char* p = fifo.data();
#pragma once

#include <cstddef>
#include <utility>

namespace topocoll {

class MappedRegion {
 public:
  MappedRegion() = default;
  /// Takes ownership of [p, p + size), which mmap returned.
  MappedRegion(void* p, size_t size) : ptr_(p), size_(size) {}
  MappedRegion(MappedRegion&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedRegion& operator=(MappedRegion&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() { reset(); }

  /// `size` bytes of `fd` from offset 0, shared and read-write. Throws Error(kSystemError) naming `what`.
  static MappedRegion shared(int fd, size_t size, const char* what);
  /// `size` zeroed private bytes, read-write. Throws Error(kSystemError) naming `what`.
  static MappedRegion anonymous(size_t size, const char* what);

  void* get() const { return ptr_; }
  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return size_; }
  bool valid() const { return ptr_ != nullptr; }
  /// Unmaps what it holds (if anything).
  void reset();

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace topocoll
