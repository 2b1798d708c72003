// What a collective algorithm sees of the communicator: asynchronous sends and receives of byte ranges to a ring or
// tree neighbour (or any peer) on one channel, which complete in issue order per connection; the channels' rings and
// trees; scratch memory; the peers' buffers where they can be mapped. The progress layer implements it over the
// connections and the engine (progress/channel_links.h); tests implement it over threads (tests/collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace topocoll::progress {

/// NCCL's protocol ids: LL 0, Simple 2 (LL128 is not built for host memory).
enum class Proto : int { kLL = 0, kSimple = 2 };

/// Which side of a transfer copies when it goes as a single copy.
enum class Copier { kAny, kPull, kPush };

/// What a rank tells its peers about one of its buffers so that they can map it (opaque to the algorithms: the
/// progress layer fills it from the transport's RegionRef). Sent as bytes.
class Mailboxes;

struct PeerBuffer {
  uint64_t words[8] = {};
};

/// A collective call as the ranks compare it (collectives::callSignature): `word` encodes the collective, the type,
/// the op, the root, the count and the call's number; `describe` words it for the messages. Opaque to this layer.
struct CallSignature {
  uint64_t word = 0;
  std::string (*describe)(uint64_t word) = nullptr;
};

/// What an algorithm needs from the communicator.
class Links {
 public:
  virtual ~Links() = default;
  virtual int rank() const = 0;
  virtual int nRanks() const = 0;
  /// Channels with rings (and trees).
  virtual int nChannels() const = 0;
  /// Channel `c`'s ring, from rank 0's position (every rank sees the same).
  virtual const int* ring(int c) const = 0;
  virtual int treeUp(int c) const = 0;
  /// Children of channel `c`'s tree, -1 where none (at most 3).
  virtual int treeDown(int c, int i) const = 0;
  /// Asynchronous transfer of `bytes` to/from `peer` on channel `c` (LL or Simple by `proto`); completes in order
  /// with the others on the same connection. `staged`: the receiver reduces what arrives (a slice through the FIFOs,
  /// in the cache); otherwise the data lands where it stays (single copies welcome). Both sides pass the same.
  /// `copier` (sender only, not staged): who makes a single copy, the receiver (kPull), the sender (kPush) or the
  /// connector's default (kAny); lets the two processes copy at once. Returns a handle for wait().
  virtual int send(int c, int peer, const void* buf, size_t bytes, Proto proto, bool staged, Copier copier) = 0;
  virtual int recv(int c, int peer, void* buf, size_t bytes, Proto proto, bool staged) = 0;
  /// Starts what was created so far without waiting (offers published), so that the caller can do local work
  /// while the peers copy.
  virtual void start() = 0;
  /// Blocks until handle `h` completed; throws its error.
  virtual void wait(int h) = 0;
  /// Blocks until every handle completed (and forgets them); throws the first error.
  virtual void waitAll() = 0;
  /// Makes sure every peer can be reached (direct algorithm; collective: every rank calls it).
  virtual void connectAll() = 0;
  /// A buffer of at least `bytes` owned by the communicator (kept between calls: no allocation per call).
  virtual char* scratch(size_t bytes) = 0;
  /// A collective starts (what the previous one mapped may be let go). `streamOutputs`: whether single copies into
  /// this rank's output (receives outside the scratch) and pushes into a peer's may bypass the caches (the output is
  /// kStreamCopyMin or more); where a copy goes through a mapping of the peer's buffer (transport/peer_memory.h) it
  /// then uses copyStreaming. `call`: what the rank called, for the peers to compare (every message of the
  /// collective carries it in its header, transport::MessageDesc::call; a receiver whose call differs fails both
  /// sides, naming the two calls).
  virtual void beginCollective(bool streamOutputs, const CallSignature& call) { (void)streamOutputs, (void)call; }
  /// Reductions straight out of the peers' inputs (docs/collectives.md, "Mapped inputs"): describes this rank's
  /// buffer [p, p + bytes) for the peers (false: they cannot map it), and gives the local address of a peer's
  /// described buffer of `bytes` (nullptr: it cannot be mapped here, or not across this pair's connection, or the
  /// peer described another length: a call that differs between ranks, which the copying path reports). Both are local
  /// (no message); the algorithm exchanges the descriptions and agrees on the outcome.
  virtual bool describeBuffer(const void* p, size_t bytes, PeerBuffer* out) {
    (void)p, (void)bytes, (void)out;
    return false;
  }
  virtual const char* mapPeerBuffer(int peer, const PeerBuffer& b, size_t bytes) {
    (void)peer, (void)b, (void)bytes;
    return nullptr;
  }
  /// The point-to-point mailboxes of the one-shot path (progress/mailboxes.h); nullptr: none (the algorithms run).
  virtual Mailboxes* mailboxes() { return nullptr; }
};

}  // namespace topocoll::progress
