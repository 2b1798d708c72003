// The Links of the collectives layer over a communicator's connectors (runtime private; collectives.cc).
#pragma once

#include <memory>
#include <vector>

#include "engine.h"
#include "topocoll/collectives/algorithms.h"
#include "topocoll/transport/peer_memory.h"

namespace topocoll::runtime {
class Communicator;
}

namespace topocoll::runtime::detail {

class CollLinks final : public collectives::Links {
 public:
  explicit CollLinks(Communicator& c) : c_(c) {}
  ~CollLinks() override;

  int rank() const override;
  int nRanks() const override;
  int nChannels() const override;
  const int* ring(int c) const override;
  int treeUp(int c) const override;
  int treeDown(int c, int i) const override;
  int send(int c, int peer, const void* buf, size_t bytes, collectives::Proto proto, bool staged,
           collectives::Copier copier) override;
  int recv(int c, int peer, void* buf, size_t bytes, collectives::Proto proto, bool staged) override;
  void start() override;
  void wait(int h) override;
  void waitAll() override;
  void connectAll() override;
  char* scratch(size_t bytes) override;
  void beginCollective(bool streamOutputs) override;
  bool describeBuffer(const void* p, size_t bytes, collectives::PeerBuffer* out) override;
  const char* mapPeerBuffer(int peer, const collectives::PeerBuffer& b, size_t bytes) override;
  /// After a failure: lets every posted transfer end (each fails at once on a broken connection, or at the
  /// timeout), so that none touches the user's buffers after the collective returned.
  void drain();

 private:
  // Posts what was created since the last post. A whole step of single-part transfers on distinct connectors with
  // nothing else queued is driven by the caller directly (the latency path).
  bool flush(bool all);

  Communicator& c_;
  // Hands the ops of the call back to the pool (those nobody else holds).
  void recycle();

  std::vector<std::shared_ptr<Op>> ops_, fresh_;
  OpPool pool_;
  std::vector<Op*> raw_;
  size_t posted_ = 0;
  bool allConnected_ = false;
  char* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  bool streamOutputs_ = false;
  std::vector<std::shared_ptr<const transport::PeerMapping>> mapped_;  // the peers' buffers this collective reads
};

}  // namespace topocoll::runtime::detail
