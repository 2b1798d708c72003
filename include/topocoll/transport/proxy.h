// The proxy (NCCL's src/proxy.cc, seed 001): one thread per rank that owns the buffers peers map, answers the
// peers' requests for them, watches the peers' processes and progresses network transfers. Other threads talk to it
// with callBlocking (NCCL's ncclProxyCallBlocking with ncclProxyMsgSetup / Connect / Free); a transport's
// ProxyConnection says what those messages do.
//
// Shareable buffers are memfds, never named segments: nothing can be left in /dev/shm, even after kill -9. A peer
// process gets the fd over an abstract Unix socket (no file either) served by this thread, after checking the
// communicator id and the rank of the request; it maps it and closes the fd. Memory stays valid for the peer as long
// as it keeps its mapping, whatever happens to the owner.
//
//   auto conn = std::make_shared<MyProxyConnection>(...);
//   proxy.callBlocking(*conn, Proxy::Msg::kSetup, &req, sizeof(req), &resp, sizeof(resp));
//   MappedRegion m = proxy.importShareable(peerRank, resp.buffer);     // on the peer, from the connect record
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "topocoll/mapped_region.h"
#include "topocoll/transport/doorbell.h"
#include "topocoll/transport/transport.h"

namespace topocoll::transport {

class Proxy;

/// What a connect record carries of a shareable buffer (NCCL's ncclP2pBuff / ncclShmIpcDesc).
struct ShareableBuffer {
  uint32_t id = 0;          // in the owner's proxy; 0 is the owner's process doorbell
  uint32_t reserved = 0;
  uint64_t size = 0;
  uint64_t ownerAddr = 0;   // where the owner mapped it (same-process peers and single-copy probes)
};

/// One transport connection as the proxy sees it (NCCL's ncclProxyConnection with its transport's proxy handlers).
/// Handlers run on the proxy thread.
class ProxyConnection {
 public:
  virtual ~ProxyConnection() = default;
  virtual void setup(Proxy& proxy, const void* req, size_t reqSize, void* resp, size_t respSize) {}
  /// False while in progress (the caller calls again).
  virtual bool connect(Proxy& proxy, const void* req, size_t reqSize, void* resp, size_t respSize) { return true; }
  virtual void free(Proxy& proxy) {}
  /// Moves data while the connection is active; true when anything advanced. Throwing marks the connection failed.
  virtual bool progress(Proxy& proxy) { return false; }
  /// Descriptors progress() waits on, so that the proxy can sleep in poll() instead of spinning.
  virtual void pollFds(std::vector<pollfd>& fds) {}
  /// Called once with the first error progress() threw.
  virtual void failed(const std::string& why) {}
};

class Proxy {
 public:
  enum class Msg { kSetup, kConnect, kFree };
  struct Options {
    int rank = 0, nRanks = 1;
    uint64_t commId = 0;  // in the socket's name, which anyone on the host can read (/proc/net/unix)
    /// A secret of the job's ranks (mixed from their nonces, never in a name): every request carries it.
    uint64_t key = 0;
    /// [rank] the rank's process id (empty: not checked). A request must come from the process of the rank it
    /// names, an answer from the process of the rank asked (SO_PEERCRED), and both from this process's user.
    std::vector<int32_t> pids;
    std::shared_ptr<Doorbell> doorbell;                          // this process's: exported as buffer 0
    std::shared_ptr<PeerGone> peerGone;   // set when a peer process disappears (or its communicator)
    const std::atomic<bool>* abortFlag = nullptr;
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  };
  /// Starts the thread and the rank's Unix socket (proxySocketName(commId, rank)).
  explicit Proxy(const Options& opts);
  /// Stops the thread; frees every buffer still exported and closes every socket.
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  /// Runs `msg` of `conn` on the proxy thread and waits for it (NCCL's ncclProxyCallBlocking). Returns what the
  /// handler returned (kConnect: false = in progress); rethrows what it threw.
  bool callBlocking(ProxyConnection& conn, Msg msg, const void* req = nullptr, size_t reqSize = 0,
                    void* resp = nullptr, size_t respSize = 0);
  /// Progress `conn` from now on / no more (any thread).
  void activate(std::shared_ptr<ProxyConnection> conn);
  void deactivate(ProxyConnection* conn);
  /// Something to progress: wakes the thread if it sleeps.
  Waker& waker();

  /// Proxy thread only (from a setup handler): a zeroed shareable buffer of `size` bytes, mapped here.
  ShareableBuffer allocateShareable(size_t size, char** ptr);
  /// Proxy thread only: stops exporting buffer `id` and unmaps it here.
  void releaseShareable(uint32_t id);
  /// Any thread: maps buffer `b` of rank `owner`'s proxy (this process's included). Throws naming the owner when it
  /// cannot be reached or refuses.
  MappedRegion importShareable(int owner, const ShareableBuffer& b);
  /// Any thread: the doorbell of rank `owner`'s process, from its proxy. From then on this proxy keeps a socket to
  /// the owner's proxy open and sets peerGone[owner] when it closes (kPeerProcessGone) or the owner's communicator
  /// ends (kPeerLeftComm).
  std::shared_ptr<Doorbell> importDoorbell(int owner);

  int rank() const { return opts_.rank; }
  const Options& options() const { return opts_; }

  struct Impl;

 private:
  Options opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace topocoll::transport
