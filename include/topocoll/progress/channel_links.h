// The Links of the collective algorithms (progress/links.h) over a communicator's connections and engine: each send
// or receive an algorithm makes becomes an op of the engine on the connector Connections::linkConnector gives (the
// ring or tree connector init made, else a point-to-point one); ops are taken from a pool, so that a warm collective
// allocates nothing.
//
//   progress::ChannelLinks links(conns, engine);
//   links.beginCollective(false, collectives::callSignature(args, n));
//   collectives::run(links, args, choice);   // the algorithm sends, receives and waits through links
//   // on failure: links.drain() before the buffers go back to the caller
#pragma once

#include <memory>
#include <vector>

#include "topocoll/progress/connections.h"
#include "topocoll/progress/engine.h"
#include "topocoll/progress/links.h"
#include "topocoll/transport/peer_memory.h"

namespace topocoll::progress {

class ChannelLinks final : public Links {
 public:
  /// `mailboxes`: the one-shot path's (nullptr: none); must outlive the links.
  ChannelLinks(Connections& conns, Engine& engine, Mailboxes* mailboxes = nullptr)
      : conns_(conns), engine_(engine), mailboxes_(mailboxes) {}
  ~ChannelLinks() override;

  int rank() const override;
  int nRanks() const override;
  int nChannels() const override;
  const int* ring(int c) const override;
  int treeUp(int c) const override;
  int treeDown(int c, int i) const override;
  int send(int c, int peer, const void* buf, size_t bytes, Proto proto, bool staged, Copier copier) override;
  int recv(int c, int peer, void* buf, size_t bytes, Proto proto, bool staged) override;
  void start() override;
  void wait(int h) override;
  void waitAll() override;
  void connectAll() override;
  char* scratch(size_t bytes) override;
  void beginCollective(bool streamOutputs, const CallSignature& call) override;
  bool describeBuffer(const void* p, size_t bytes, PeerBuffer* out) override;
  const char* mapPeerBuffer(int peer, const PeerBuffer& b, size_t bytes) override;
  Mailboxes* mailboxes() override { return mailboxes_; }
  /// After a failure: lets every posted transfer end (each fails at once on a broken connection, or at the
  /// timeout), so that none touches the user's buffers after the collective returned.
  void drain();

 private:
  /// The op of one step: a single transfer on the connector linkConnector gives, with the collective's options.
  std::shared_ptr<Op> makeOp(bool send, int channel, int peer, void* buf, size_t bytes, Proto proto, bool staged,
                             Copier copier, bool streamStores);
  // Posts what was created since the last post. A whole step of single-part transfers on distinct connectors with
  // nothing else queued is driven by the caller directly (the latency path).
  bool flush(bool all);
  // Hands the ops of the call back to the pool (those nobody else holds).
  void recycle();

  Connections& conns_;
  Engine& engine_;
  Mailboxes* mailboxes_ = nullptr;
  std::vector<std::shared_ptr<Op>> ops_, fresh_;
  OpPool pool_;
  std::vector<Op*> raw_;
  size_t posted_ = 0;
  bool allConnected_ = false;
  char* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  bool streamOutputs_ = false;
  CallSignature call_;  // the running collective's (beginCollective)
  std::vector<std::shared_ptr<const transport::PeerMapping>> mapped_;  // the peers' buffers this collective reads
};

}  // namespace topocoll::progress
