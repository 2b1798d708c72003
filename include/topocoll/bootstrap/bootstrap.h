// Bootstrap: how ranks find each other and exchange small records before any transport exists (seed 002's
// bootstrapState). An interface, a TCP implementation and an in-memory one for multi-rank unit tests.
//
//   topocoll::bootstrap::RootHandle root;                      // on one process
//   auto id = topocoll::bootstrap::createUniqueId(&root);      // ship `id` to every rank
//   auto bs = topocoll::bootstrap::TcpBootstrap::connect(id, rank, nRanks, opts);
//   bs->allGather(records.data(), sizeof(Record));             // every rank's slot filled
#pragma once

#include "topocoll/export.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "topocoll/auth.h"

namespace topocoll::bootstrap {

/// Rank-to-rank exchange used during communicator initialisation. Every call blocks until done, its deadline
/// passes (Error kTimeout naming the rank waited for) or the abort flag is set (Error kAborted). When a rank dies
/// or aborts, every other rank's pending and later calls fail with Error(kRemoteError) naming that rank and the
/// phase ("rank 2 died during the peer-info allgather"). One receiving call (allGather, recv, barrier, broadcast)
/// at a time; send may run beside it.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int nRanks() const = 0;
  /// `data` holds nRanks slots of `size` bytes; this rank's slot is filled on entry, all slots on return.
  virtual void allGather(void* data, size_t size) = 0;
  /// Tagged point-to-point messages; messages of other (peer, tag) pairs are queued until asked for.
  virtual void send(int peer, int tag, const void* data, size_t size) = 0;
  virtual void recv(int peer, int tag, void* data, size_t size) = 0;
  virtual void barrier();
  virtual void broadcast(int root, void* data, size_t size);
  /// Names what the ranks are doing now ("peer-info allgather"), for the messages of failures.
  virtual void setPhase(const std::string& phase) {}
  /// This rank gives up: every other rank is told (best effort) that it failed during the current phase because
  /// of `reason`, and this bootstrap's later calls fail. Does nothing when the job already failed elsewhere.
  virtual void abort(const std::string& reason) {}
  /// Passes a failure this rank heard of (failedElsewhere's text) on to its ring neighbours before the rank leaves
  /// because of it: a neighbour whose word came only through a root that has exited would otherwise blame this
  /// rank for leaving. Once; not after this rank told the job itself.
  virtual void relay(const std::string& text) { (void)text; }
  /// Whether another rank's abort() (or the root's word of a failure) reached this rank: `why` gets its message, the
  /// job's first failure as this rank learnt it. Serves what arrived meanwhile, for up to `wait` while nothing did;
  /// never blocks behind another thread's receiving call (which serves the same messages). False after this rank's
  /// own abort(): it was the first to fail, as far as it knows.
  virtual bool failedElsewhere(std::string* why, std::chrono::milliseconds wait = {}) {
    (void)why, (void)wait;
    return false;
  }
  /// A message of `tag` and `size` bytes from any rank, if one arrived (its sender in `from`); never waits, never
  /// blocks behind another thread's receiving call. Messages of that tag with another size are dropped.
  virtual bool tryRecvAny(int tag, int* from, void* data, size_t size) {
    (void)tag, (void)from, (void)data, (void)size;
    return false;
  }
  /// Whether a message of `tag` from `peer` arrived and waits for a recv (nothing is taken); never waits, never
  /// blocks behind another thread's receiving call (false then: ask again).
  virtual bool hasMessage(int peer, int tag) {
    (void)peer, (void)tag;
    return false;
  }
  /// The secret of a communicator made from this one (split, shrink), for `context`: only this job's ranks can
  /// compute it (AuthKey::child of the job's secret).
  virtual AuthKey childKey(std::string_view context) const = 0;
  /// Where a root for such a communicator listens, "host:0" (the address this rank's peers reach it at; "" for the
  /// default address).
  virtual std::string childRootHost() const { return ""; }
  /// The address `peer` is reached at (its host, for messages naming a host that stopped answering); "" if none.
  virtual std::string peerHost(int peer) const {
    (void)peer;
    return "";
  }
  /// Point-to-point messages that go on after the job failed or this rank aborted (ncclCommShrink with dead ranks):
  /// between ranks that are still alive they work as send/recv do, authenticated alike; a failure of the job that
  /// arrives meanwhile does not end them. recvSurvivor waits up to the bootstrap's timeout.
  virtual void sendSurvivor(int peer, int tag, const void* data, size_t size) { send(peer, tag, data, size); }
  virtual void recvSurvivor(int peer, int tag, void* data, size_t size) { recv(peer, tag, data, size); }
};

struct Options {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // TOPOCOLL_TIMEOUT, seconds
  const std::atomic<bool>* abortFlag = nullptr;
  size_t maxMessageBytes = 64u << 20;
  std::string socketIfname;  // NCCL_SOCKET_IFNAME
  std::string socketFamily;  // NCCL_SOCKET_FAMILY
  std::string testDieAfter;  // TOPOCOLL_TEST_DIE_AFTER (tests only): "register" or "ring" exits the process there
};

/// Opaque, fixed-size rendezvous id (as ncclUniqueId, 128 bytes): the job's magic, the root's address and the job's
/// secret, which every connection of the job proves it holds (auth.h). Whoever holds the id can join the job: ship it
/// over a channel strangers cannot read.
struct UniqueId {
  std::array<uint8_t, 128> bytes{};
};
/// The job's secret carried by `id`.
AuthKey keyOf(const UniqueId& id);
/// `id` with `key` as its secret.
UniqueId withKey(const UniqueId& id, const AuthKey& key);

/// The root listener that ranks register with; keep it alive until every rank has connected. Movable, not copyable.
class Root;
struct TOPOCOLL_API RootHandle {
  std::unique_ptr<Root> root;
  RootHandle();
  RootHandle(RootHandle&&) noexcept;
  RootHandle& operator=(RootHandle&&) noexcept;
  ~RootHandle();
  /// The process hosting the root failed (its own rank's init, typically) and is about to exit with the root:
  /// unless the job already failed for another reason, every rank is told `reason`. Waits until every rank of the
  /// job knows the failure (ranks that register meanwhile are told at once) or `linger` passes.
  void abort(const std::string& reason, std::chrono::milliseconds linger);
  /// No root, or its thread has ended (every rank joined, or the job failed and was told): nothing is lost by
  /// destroying the handle now.
  bool finished() const;
};

/// Starts a root listener (on `hostPort` "host:port" when given, as NCCL_COMM_ID; else an ephemeral port on the
/// first non-loopback IPv4 address, loopback when there is none) and returns its id. `magic` 0 draws a random one.
/// `nRanks` > 0 is the job size the root expects (a rank started with another is named); 0 learns it from the
/// first registration. `key` is the job's secret (null: a random one). Throws when the address is in use (by another
/// job, typically).
TOPOCOLL_API UniqueId createUniqueId(RootHandle* holder, const std::string& hostPort = "", uint64_t magic = 0, int nRanks = 0,
                        const AuthKey* key = nullptr);
/// The id of a root that another process starts at `hostPort` with `magic` and `key` (launcher-driven jobs).
UniqueId uniqueIdFor(const std::string& hostPort, uint64_t magic, const AuthKey& key);

class TcpBootstrap : public Bootstrap {
 public:
  /// Registers with the root, forms the bootstrap ring and learns every rank's address.
  static std::unique_ptr<TcpBootstrap> connect(const UniqueId& id, int rank, int nRanks, const Options& opts = {});
  ~TcpBootstrap() override;
  int rank() const override { return rank_; }
  int nRanks() const override { return nRanks_; }
  void allGather(void* data, size_t size) override;
  void send(int peer, int tag, const void* data, size_t size) override;
  void recv(int peer, int tag, void* data, size_t size) override;
  void setPhase(const std::string& phase) override;
  void abort(const std::string& reason) override;
  void relay(const std::string& text) override;
  bool failedElsewhere(std::string* why, std::chrono::milliseconds wait = {}) override;
  bool tryRecvAny(int tag, int* from, void* data, size_t size) override;
  bool hasMessage(int peer, int tag) override;
  AuthKey childKey(std::string_view context) const override;
  std::string childRootHost() const override;
  std::string peerHost(int peer) const override;
  void sendSurvivor(int peer, int tag, const void* data, size_t size) override;
  void recvSurvivor(int peer, int tag, void* data, size_t size) override;

  struct Impl;

 private:
  TcpBootstrap() = default;
  int rank_ = 0, nRanks_ = 0;
  std::unique_ptr<Impl> impl_;
};

/// All ranks in one process (threads), for tests of multi-rank logic.
class InMemoryGroup;
std::vector<std::unique_ptr<Bootstrap>> makeInMemoryGroup(int nRanks, const Options& opts = {});

}  // namespace topocoll::bootstrap
