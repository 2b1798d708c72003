// The operating-system pieces the transports share: memfds, futexes, abstract Unix sockets passing descriptors,
// single copies between processes. RAII for every descriptor.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "topocoll/unique_fd.h"

namespace topocoll::transport::os {

/// A zero-filled memfd of `size` bytes (sealed against shrinking). Throws kSystemError.
UniqueFd createMemfd(const char* name, size_t size);
/// The size of an fd's file (fstat), for checking what a peer sent.
size_t fileSize(int fd);

/// futex(FUTEX_WAIT) on a word that may be shared between processes; returns on a wake, a changed value or the
/// timeout (false: the timeout).
bool futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
void futexWakeAll(std::atomic<uint32_t>* word);

/// Abstract-namespace Unix stream sockets: no file in the file system, gone with the process.
UniqueFd listenUnix(const std::string& name);
/// Connects (non-blocking socket afterwards); throws kRemoteError naming `what` when nobody listens.
UniqueFd connectUnix(const std::string& name, const std::string& what);
/// The process and user at the other end of a connected Unix socket (SO_PEERCRED, as the kernel recorded them at
/// connect / listen: not forgeable by the peer). pid 0: the peer is in a PID namespace this process cannot see.
/// false when the kernel cannot say.
bool peerCredentials(int sock, int* pid, unsigned* uid);
/// Sends `size` bytes and, when fdToSend >= 0, the descriptor with them (SCM_RIGHTS). Blocking with a deadline.
void sendMsg(int sock, const void* data, size_t size, int fdToSend, std::chrono::steady_clock::time_point deadline,
             const std::string& what);
/// Receives exactly `size` bytes and at most one descriptor (-1 if none came). Blocking with a deadline; throws
/// kRemoteError when the peer closes, kTimeout at the deadline.
int recvMsg(int sock, void* data, size_t size, std::chrono::steady_clock::time_point deadline, const std::string& what);

/// Copies `n` bytes between this process and process `pid` (process_vm_readv when `pull`, else writev). Returns 0 or
/// the errno (EPERM, ESRCH, EFAULT, ENOSYS...).
int copyRemote(pid_t pid, bool pull, void* local, uint64_t remote, size_t n);

/// Whether process `pid` has ended: no such process, or a zombie its parent has not reaped yet (it copies nothing
/// any more, but kill(pid, 0) still finds it).
bool processEnded(pid_t pid);

}  // namespace topocoll::transport::os
