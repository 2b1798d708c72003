#include "os.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "topocoll/status.h"

namespace topocoll::transport::os {

UniqueFd createMemfd(const char* name, size_t size) {
  UniqueFd fd(static_cast<int>(::syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!fd.valid()) fail(StatusCode::kSystemError, "memfd_create({}): {}", name, std::strerror(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    fail(StatusCode::kSystemError, "ftruncate of memfd {} to {} bytes: {}", name, size, std::strerror(errno));
  ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

bool peerCredentials(int sock, int* pid, unsigned* uid) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0 || len != sizeof(c)) return false;
  *pid = static_cast<int>(c.pid);
  *uid = static_cast<unsigned>(c.uid);
  return true;
}

size_t fileSize(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  return static_cast<size_t>(st.st_size);
}

bool futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>(timeout.count() % 1000000) * 1000};
  long r = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
  return r == 0 || errno != ETIMEDOUT;
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

namespace {

socklen_t abstractAddress(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(a->sun_path) - 1);
  std::memcpy(a->sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void waitFd(int fd, short events, std::chrono::steady_clock::time_point deadline, const std::string& what) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) fail(StatusCode::kTimeout, "timeout while {}", what);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r > 0) return;
    if (r < 0 && errno != EINTR) fail(StatusCode::kSystemError, "poll while {}: {}", what, std::strerror(errno));
  }
}

}  // namespace

UniqueFd listenUnix(const std::string& name) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) fail(StatusCode::kSystemError, "socket(AF_UNIX): {}", std::strerror(errno));
  sockaddr_un a;
  socklen_t len = abstractAddress(name, &a);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0)
    fail(StatusCode::kSystemError, "bind of the proxy socket @{}: {}", name, std::strerror(errno));
  if (::listen(s.get(), 1024) != 0) fail(StatusCode::kSystemError, "listen(@{}): {}", name, std::strerror(errno));
  return s;
}

UniqueFd connectUnix(const std::string& name, const std::string& what) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) fail(StatusCode::kSystemError, "socket(AF_UNIX): {}", std::strerror(errno));
  sockaddr_un a;
  socklen_t len = abstractAddress(name, &a);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0)
    fail(StatusCode::kRemoteError, "{}: cannot reach its proxy socket @{} ({}; another network namespace?)", what,
         name, std::strerror(errno));
  ::fcntl(s.get(), F_SETFL, ::fcntl(s.get(), F_GETFL) | O_NONBLOCK);
  return s;
}

void sendMsg(int sock, const void* data, size_t size, int fdToSend, std::chrono::steady_clock::time_point deadline,
             const std::string& what) {
  const char* p = static_cast<const char*>(data);
  bool fdSent = fdToSend < 0;
  while (size > 0) {
    iovec iov{const_cast<char*>(p), size};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    if (!fdSent) {
      m.msg_control = ctl;
      m.msg_controllen = sizeof(ctl);
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fdToSend, sizeof(int));
    }
    ssize_t n = ::sendmsg(sock, &m, MSG_NOSIGNAL);
    if (n > 0) {
      fdSent = true;
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      waitFd(sock, POLLOUT, deadline, what);
      continue;
    }
    fail(StatusCode::kRemoteError, "{}: {}", what, n < 0 ? std::strerror(errno) : "connection closed");
  }
}

int recvMsg(int sock, void* data, size_t size, std::chrono::steady_clock::time_point deadline,
            const std::string& what) {
  char* p = static_cast<char*>(data);
  int fd = -1;
  while (size > 0) {
    iovec iov{p, size};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    ssize_t n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int got;
          std::memcpy(&got, CMSG_DATA(c), sizeof(int));
          if (fd < 0) fd = got;
          else ::close(got);  // one descriptor per message: drop extras
        }
      }
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      try {
        waitFd(sock, POLLIN, deadline, what);
      } catch (...) {
        if (fd >= 0) ::close(fd);
        throw;
      }
      continue;
    }
    if (fd >= 0) ::close(fd);
    fail(StatusCode::kRemoteError, "{}: {}", what, n < 0 ? std::strerror(errno) : "connection closed by the peer");
  }
  return fd;
}

bool processEnded(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold parentheses).
  const char* close = std::strrchr(buf, ')');
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

int copyRemote(pid_t pid, bool pull, void* local, uint64_t remote, size_t n) {
  char* l = static_cast<char*>(local);
  while (n > 0) {
    iovec li{l, n};
    iovec ri{reinterpret_cast<void*>(remote), n};
    ssize_t r = pull ? ::process_vm_readv(pid, &li, 1, &ri, 1, 0) : ::process_vm_writev(pid, &li, 1, &ri, 1, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EFAULT;
    l += r;
    remote += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return 0;
}

}  // namespace topocoll::transport::os
