// Shareable buffers (runtime::memAlloc) and a peer process's view of them: what regionOf finds, that a peer maps
// exactly the buffer named and refuses forged descriptions, and that the mapping reads and writes the owner's bytes.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "topocoll/status.h"
#include "topocoll/transport/peer_memory.h"

namespace topocoll::transport {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(ShareableBuffer, RegionOfCoversExactlyTheBuffer) {
  EXPECT_EQ(allocShareable(0), nullptr);
  char* p = static_cast<char*>(allocShareable(3 * kMiB));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < 4 * kMiB; i += 4096) ASSERT_EQ(p[i], 0) << "zeroed, rounded up to 2 MiB pages";
  RegionRef r = regionOf(p, 3 * kMiB);
  ASSERT_GE(r.fd, 0);
  EXPECT_EQ(r.base, reinterpret_cast<uint64_t>(p));
  EXPECT_EQ(r.len, 4 * kMiB);
  EXPECT_NE(r.owner, 0u);
  EXPECT_GE(regionOf(p + 1, 4 * kMiB - 1).fd, 0);
  EXPECT_LT(regionOf(p + 1, 4 * kMiB).fd, 0) << "one byte past the end";
  EXPECT_LT(regionOf(p - 1, 1).fd, 0);
  int onStack = 0;
  EXPECT_LT(regionOf(&onStack, sizeof onStack).fd, 0);
  char* q = static_cast<char*>(allocShareable(1));
  EXPECT_NE(regionOf(q, 1).serial, r.serial) << "every buffer has its own number";
  EXPECT_EQ(regionOf(q, 1).owner, r.owner);
  freeShareable(q);
  freeShareable(p);
  EXPECT_LT(regionOf(p, 1).fd, 0) << "freed";
  freeShareable(nullptr);
}

// Each buffer holds a descriptor: above 1023 where the limit allows, and none within 64 of the limit (anonymous
// memory then), so a program with many buffers never runs out of descriptors because of them.
TEST(ShareableBuffer, DescriptorsStayHighAndNeverExhaustTheLimit) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit lim{};
    bool ok = ::getrlimit(RLIMIT_NOFILE, &lim) == 0;
    if (lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= 4096) {
      lim.rlim_cur = 4096;
      ok = ok && ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
    }
    void* p = allocShareable(1);
    ok = ok && (lim.rlim_cur <= 2048 || regionOf(p, 1).fd >= 1024);
    lim.rlim_cur = 256;
    ok = ok && ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
    std::vector<void*> bufs;
    int anonymous = 0;
    for (int i = 0; i < 300; ++i) {
      bufs.push_back(allocShareable(1));
      anonymous += regionOf(bufs.back(), 1).fd < 0;
    }
    int probe = ::dup(0);  // descriptors are left for the program
    ok = ok && probe >= 0 && anonymous > 0;
    for (void* b : bufs) freeShareable(b);
    freeShareable(p);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// fork(): a kShared buffer stays one memory for parent and child (ncclMemAlloc's buffers); a kCopied one (PyTorch's
// tensors) is copied as fork() copies anonymous memory: same address and the bytes of the moment of fork() in the
// child (the parent's writes right after fork() do not reach it), private, no longer shareable there, freed as
// usual; the parent's stays shareable and never sees the child's writes; one marked unused is fresh memory there.
// fork() with kShared, kCopied and unused kCopied buffers. kCopied keeps anonymous memory's meaning either way:
// with a peer access in flight the child copies at once and the parent's buffer stays shareable; without, the
// parent's becomes copy-on-write (not shareable until reshare(), which keeps its bytes and leaves the child's alone).
void forkKeepsEachSidesBytes(bool accessInFlight) {
  char* shared = static_cast<char*>(allocShareable(3 * kMiB, OnFork::kShared));
  char* copied = static_cast<char*>(allocShareable(3 * kMiB, OnFork::kCopied));
  char* dead = static_cast<char*>(allocShareable(3 * kMiB, OnFork::kCopied));
  std::memset(shared, 's', 3 * kMiB);
  std::memset(copied, 'c', 3 * kMiB);
  std::memset(dead, 'd', 3 * kMiB);
  markUnused(dead, true);  // a cached block: the child gets fresh memory there, not a copy
  const RegionRef before = regionOf(copied, 1);
  ASSERT_GE(before.fd, 0);
  if (accessInFlight) notePeerAccess(1);
  int toChild[2];
  ASSERT_EQ(::pipe(toChild), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(toChild[1]);
    bool ok = copied[0] == 'c' && copied[3 * kMiB - 1] == 'c' && regionOf(copied, 1).fd < 0 &&
              regionOf(shared, 1).fd >= 0 && dead[0] == 0 && dead[3 * kMiB - 1] == 0 && regionOf(dead, 1).fd < 0;
    char c;
    ok = ok && ::read(toChild[0], &c, 1) == 1;  // the parent wrote (and reshared) meanwhile: none of it reaches us
    for (size_t i = 0; i < 3 * kMiB; i += 4096) ok = ok && copied[i] == 'c';
    std::memset(copied, 'x', 3 * kMiB);
    shared[0] = 'y';
    ok = ok && copied[kMiB] == 'x';
    try {
      freeShareable(copied);
      void* again = allocShareable(kMiB, OnFork::kCopied);  // the child's own buffers are shareable
      ok = ok && regionOf(again, 1).fd >= 0 && regionOf(again, 1).owner != 0;
      freeShareable(again);
    } catch (...) {
      ok = false;
    }
    _exit(ok ? 0 : 1);
  }
  ::close(toChild[0]);
  if (accessInFlight) notePeerAccess(-1);
  if (accessInFlight) {
    EXPECT_EQ(regionOf(copied, 1).serial, before.serial) << "the child copied: still shareable here";
  } else {
    EXPECT_LT(regionOf(copied, 1).fd, 0) << "copy-on-write here now";
  }
  std::memset(copied, 'p', 2 * kMiB);
  if (!accessInFlight) {
    bool copiedNow = false;
    EXPECT_TRUE(reshare(copied, &copiedNow));
    EXPECT_TRUE(copiedNow) << "this call made the copy";
    const RegionRef again = regionOf(copied, 1);
    EXPECT_GE(again.fd, 0);
    EXPECT_NE(again.serial, before.serial) << "a new memfd: peers must not take it for the old one";
    EXPECT_EQ(copied[0], 'p');
    EXPECT_EQ(copied[2 * kMiB], 'c') << "reshare keeps the bytes";
    EXPECT_EQ(copied[3 * kMiB - 1], 'c');
  }
  std::memset(copied, 'p', 3 * kMiB);
  ASSERT_EQ(::write(toChild[1], "g", 1), 1);
  ::close(toChild[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child's checks";
  EXPECT_EQ(copied[0], 'p') << "the child's writes stay in the child";
  EXPECT_EQ(copied[kMiB], 'p');
  EXPECT_EQ(dead[0], 'd');
  EXPECT_EQ(shared[0], 'y') << "kShared: one memory";
  EXPECT_GE(regionOf(copied, 1).fd, 0);
  bool copiedAgain = true;
  EXPECT_TRUE(reshare(copied, &copiedAgain)) << "shareable already";
  EXPECT_FALSE(copiedAgain) << "nothing to copy";
  EXPECT_FALSE(reshare(shared + 4096)) << "not a buffer's address";
  freeShareable(dead);
  freeShareable(copied);
  freeShareable(shared);
}

TEST(ShareableBuffer, ForkCopiesIntoTheChildWhileAPeerAccessIsInFlight) { forkKeepsEachSidesBytes(true); }
TEST(ShareableBuffer, ForkMakesTheParentsCopyOnWriteWhenQuiet) { forkKeepsEachSidesBytes(false); }

TEST(ShareableBuffer, FreeingAPointerItDidNotGiveFailsClearly) {
  int onStack = 0;
  try {
    freeShareable(&onStack);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("not a pointer memAlloc returned"), std::string::npos) << e.what();
  }
  void* p = allocShareable(100);
  freeShareable(p);
  EXPECT_THROW(freeShareable(p), Error) << "twice";
}

// A child process allocates a buffer, fills it and tells the parent where it is; the parent maps it, checks the
// bytes, writes its own and the child checks those. Forged descriptions of the buffer are refused.
// A buffer reshared after a fork() (a new memfd at the same address): the view of the old one is dropped from the
// cache when the new one is mapped, not kept alive until evicted. This process plays the peer of itself.
TEST(PeerMapping, ANewerBufferAtTheSameAddressDropsTheOldView) {
  char* b = static_cast<char*>(allocShareable(2 * kMiB, OnFork::kCopied));
  std::memset(b, 'a', 2 * kMiB);
  const size_t before = peerMappingsCached();
  const RegionRef old = regionOf(b, 2 * kMiB);
  auto v1 = mapPeerRegion(::getpid(), old, old.base, 2 * kMiB);
  if (!v1) GTEST_SKIP() << "pidfd_getfd is not allowed here: nothing is mapped";
  EXPECT_EQ(peerMappingsCached(), before + 1);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_LT(regionOf(b, 1).fd, 0) << "copy-on-write after the fork";
  ASSERT_TRUE(reshare(b));
  const RegionRef now = regionOf(b, 2 * kMiB);
  auto v2 = mapPeerRegion(::getpid(), now, now.base, 2 * kMiB);
  ASSERT_TRUE(v2);
  EXPECT_EQ(peerMappingsCached(), before + 1) << "the old view left the cache";
  EXPECT_EQ(*v2->at(now, now.base), 'a');
  EXPECT_EQ(*v1->at(old, old.base), 'a') << "a holder keeps its view mapped";
  v1.reset();
  v2.reset();
  freeShareable(b);
}

TEST(PeerMapping, MapsThePeersBufferAndRefusesForgedDescriptions) {
  void* inherited = allocShareable(kMiB);  // allocated before the fork: shared with the child, under our key
  const RegionRef mine = regionOf(inherited, kMiB);
  int toParent[2], toChild[2];
  ASSERT_EQ(::pipe(toParent), 0);
  ASSERT_EQ(::pipe(toChild), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char* b = static_cast<char*>(allocShareable(2 * kMiB));
    for (size_t i = 0; i < 2 * kMiB; ++i) b[i] = static_cast<char>(i * 7 + 1);
    RegionRef r = regionOf(b, 2 * kMiB);
    RegionRef inh = regionOf(inherited, kMiB);
    bool ok = r.fd >= 0 && r.owner != mine.owner && inh.owner == mine.owner && inh.serial == mine.serial;
    ok = ok && ::write(toParent[1], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    char go = 0;
    ok = ok && ::read(toChild[0], &go, 1) == 1;
    for (size_t i = 4096; i < 4096 + 8192; ++i) ok = ok && b[i] == static_cast<char>(i * 3);
    _exit(ok ? 0 : 1);
  }
  RegionRef r;
  ASSERT_EQ(::read(toParent[0], &r, sizeof r), static_cast<ssize_t>(sizeof r));
  const size_t before = peerMappingsCached();
  // Outside the buffer: refused before any import.
  EXPECT_EQ(mapPeerRegion(pid, r, r.base - 1, 16), nullptr);
  EXPECT_EQ(mapPeerRegion(pid, r, r.base + r.len - 8, 16), nullptr);
  EXPECT_EQ(peerMappingsCached(), before);
  // Another buffer's number, another process's key, another descriptor: the memfd's name does not match.
  RegionRef forged = r;
  forged.serial += 1000;
  EXPECT_EQ(mapPeerRegion(pid, forged, r.base, 16), nullptr);
  forged = r;
  forged.owner ^= 1;
  EXPECT_EQ(mapPeerRegion(pid, forged, r.base, 16), nullptr);
  forged = r;
  forged.fd = 0;
  forged.serial += 2000;
  EXPECT_EQ(mapPeerRegion(pid, forged, r.base, 16), nullptr);
  forged = r;
  forged.len *= 2;  // bigger than the memfd
  forged.serial += 3000;
  EXPECT_EQ(mapPeerRegion(pid, forged, r.base, 16), nullptr);
  // The real one.
  auto m = mapPeerRegion(pid, r, r.base + 4096, 8192);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(mapPeerRegion(pid, r, r.base, r.len), m) << "mapped once";
  const char* at = m->at(r, r.base + 4096);
  bool same = true;
  for (size_t i = 4096; i < 4096 + 8192; ++i) same = same && at[i - 4096] == static_cast<char>(i * 7 + 1);
  EXPECT_TRUE(same);
  char* w = const_cast<char*>(at);
  for (size_t i = 4096; i < 4096 + 8192; ++i) w[i - 4096] = static_cast<char>(i * 3);
  ASSERT_EQ(::write(toChild[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child saw our bytes";
  // The owner is gone; the mapping still holds the memory, so a copy under way never faults.
  EXPECT_EQ(at[0], static_cast<char>(4096 * 3));
  for (int fd : {toParent[0], toParent[1], toChild[0], toChild[1]}) ::close(fd);
  freeShareable(inherited);
}

}  // namespace
}  // namespace topocoll::transport
