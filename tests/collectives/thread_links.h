// progress::Links over threads of one process, for testing the algorithms alone (as Gloo tests its algorithms). Each
// connection (channel, from, to) is a queue of messages. As on the real links: a send of up to kEagerBytes is copied
// at once and completes (the FIFO's eager steps); a larger one is read out of the sender's buffer only when the
// receiver takes it, and completes then (single copies, and acknowledged FIFO steps), so an algorithm that reuses a
// buffer before its send completed gets wrong data. Whenever a rank waits, it takes the messages of every receive it
// posted, in issue order per connection (the engine drives every posted op, not only the awaited one). A receive
// whose size differs from the message fails (kInvalidUsage); a wait with no progress for 10 s fails (kTimeout)
// instead of hanging the test. With `mapping`, peers' buffers are "mapped" by their address (one address space), so
// the algorithms' mapped paths run too.
//
//   ThreadWorld world(5, /*channels=*/2, /*mapping=*/true);
//   world.run([&](ThreadLinks& links) { collectives::run(links, args, choice); });  // one thread per rank
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "topocoll/progress/links.h"
#include "topocoll/status.h"

namespace topocoll::testing {

class ThreadWorld;

class ThreadLinks final : public progress::Links {
 public:
  ThreadLinks(ThreadWorld& w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int nRanks() const override;
  int nChannels() const override;
  const int* ring(int c) const override;
  int treeUp(int c) const override;
  int treeDown(int c, int i) const override;
  int send(int c, int peer, const void* buf, size_t bytes, progress::Proto, bool, progress::Copier) override;
  int recv(int c, int peer, void* buf, size_t bytes, progress::Proto, bool) override;
  void start() override;
  void wait(int h) override;
  void waitAll() override;
  void connectAll() override {}
  char* scratch(size_t bytes) override {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }
  bool describeBuffer(const void* p, size_t bytes, progress::PeerBuffer* out) override;
  const char* mapPeerBuffer(int peer, const progress::PeerBuffer& b, size_t bytes) override;

 private:
  struct Handle {
    bool recv = false;
    std::shared_ptr<bool> done;  // under the world's lock: a send's is set by the receiver that takes it
    int channel = 0, peer = 0;
    void* buf = nullptr;
    size_t bytes = 0;
  };
  // Takes the messages of the posted receives, in issue order per connection (the world's lock held).
  void pump();
  void waitFor(int h);

  ThreadWorld& w_;
  int rank_;
  std::vector<Handle> handles_;
  std::vector<char> scratch_;
};

class ThreadWorld {
 public:
  ThreadWorld(int nRanks, int nChannels, bool mapping) : n_(nRanks), mapping_(mapping) {
    for (int c = 0; c < nChannels; ++c) {
      // Channel 0 in rank order, channel 1 reversed after rank 0, and so on: each channel's tree is the binary tree
      // over its ring's positions (position p's parent is (p - 1) / 2), so each channel has other neighbours.
      std::vector<int> ring(n_);
      for (int p = 0; p < n_; ++p) ring[p] = c % 2 == 0 ? (p + c / 2) % n_ : (n_ - p + c / 2) % n_;
      std::vector<int> up(n_, -1), down(n_ * 3, -1);
      for (int p = 0; p < n_; ++p) {
        if (p > 0) up[ring[p]] = ring[(p - 1) / 2];
        for (int k = 0; k < 2; ++k)
          if (2 * p + 1 + k < n_) down[ring[p] * 3 + k] = ring[2 * p + 1 + k];
      }
      rings_.push_back(ring);
      up_.push_back(up);
      down_.push_back(down);
    }
    for (int r = 0; r < n_; ++r) links_.emplace_back(new ThreadLinks(*this, r));
    cvs_ = std::vector<std::condition_variable>(n_);
  }
  ~ThreadWorld() {
    for (auto* l : links_) delete l;
  }
  int nRanks() const { return n_; }

  /// Runs `body` on one thread per rank and waits for all; rethrows the lowest rank's error (the others' are in
  /// errors()). Messages left in a queue afterwards fail it too (a send nobody received).
  void run(const std::function<void(ThreadLinks&, int rank)>& body) {
    errors_.assign(n_, "");
    std::vector<std::exception_ptr> failed(n_);
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r)
      threads.emplace_back([&, r] {
        try {
          body(*links_[r], r);
        } catch (const std::exception& e) {
          failed[r] = std::current_exception();
          errors_[r] = e.what();
          std::lock_guard<std::mutex> lock(mu_);
          broken_ = true;
          for (auto& cv : cvs_) cv.notify_all();
        }
      });
    for (auto& t : threads) t.join();
    bool leftover = false;
    for (auto& [key, q] : queues_) leftover = leftover || !q.empty();
    queues_.clear();
    broken_ = false;
    for (auto& f : failed)
      if (f) std::rethrow_exception(f);
    if (leftover) fail(StatusCode::kInternal, "messages left unreceived after the collective");
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  friend class ThreadLinks;
  using Key = std::tuple<int, int, int>;  // channel, from, to
  /// Sends of up to this many bytes are copied at once (the real links' eager steps); larger ones are read when taken.
  static constexpr size_t kEagerBytes = 64 << 10;
  struct Message {
    std::vector<char> copy;       // an eager send's bytes
    const char* src = nullptr;    // a larger send's buffer, read when taken
    size_t bytes = 0;
    std::shared_ptr<bool> sent;   // the sender's completion
    int sender = 0;
  };
  int n_;
  bool mapping_;
  std::vector<std::vector<int>> rings_, up_, down_;
  std::vector<ThreadLinks*> links_;
  std::mutex mu_;
  std::vector<std::condition_variable> cvs_;  // [rank]: a message for it came, or a rank failed
  std::map<Key, std::deque<Message>> queues_;
  bool broken_ = false;
  std::vector<std::string> errors_;
};

inline int ThreadLinks::nRanks() const { return w_.n_; }
inline int ThreadLinks::nChannels() const { return static_cast<int>(w_.rings_.size()); }
inline const int* ThreadLinks::ring(int c) const { return w_.rings_[c].data(); }
inline int ThreadLinks::treeUp(int c) const { return w_.up_[c][rank_]; }
inline int ThreadLinks::treeDown(int c, int i) const { return i < 3 ? w_.down_[c][rank_ * 3 + i] : -1; }

inline int ThreadLinks::send(int c, int peer, const void* buf, size_t bytes, progress::Proto, bool,
                             progress::Copier) {
  if (peer < 0 || peer >= w_.n_) fail(StatusCode::kInternal, "rank {}: send to rank {}", rank_, peer);
  const char* p = static_cast<const char*>(buf);
  auto done = std::make_shared<bool>(false);
  {
    std::lock_guard<std::mutex> lock(w_.mu_);
    ThreadWorld::Message m;
    m.bytes = bytes;
    m.sent = done;
    m.sender = rank_;
    if (bytes <= ThreadWorld::kEagerBytes) {
      m.copy.assign(p, p + bytes);
      *done = true;
    } else {
      m.src = p;
    }
    w_.queues_[{c, rank_, peer}].push_back(std::move(m));
    w_.cvs_[peer].notify_all();
  }
  handles_.push_back({false, done, c, peer, nullptr, bytes});
  return static_cast<int>(handles_.size()) - 1;
}

inline int ThreadLinks::recv(int c, int peer, void* buf, size_t bytes, progress::Proto, bool) {
  if (peer < 0 || peer >= w_.n_) fail(StatusCode::kInternal, "rank {}: receive from rank {}", rank_, peer);
  handles_.push_back({true, std::make_shared<bool>(false), c, peer, buf, bytes});
  return static_cast<int>(handles_.size()) - 1;
}

inline void ThreadLinks::pump() {
  std::vector<std::pair<int, int>> blocked;  // connections whose oldest pending receive found no message
  for (Handle& x : handles_) {
    if (!x.recv || *x.done) continue;
    const std::pair<int, int> conn{x.channel, x.peer};
    if (std::find(blocked.begin(), blocked.end(), conn) != blocked.end()) continue;
    auto& q = w_.queues_[{x.channel, x.peer, rank_}];
    if (q.empty()) {
      blocked.push_back(conn);
      continue;
    }
    ThreadWorld::Message m = std::move(q.front());
    q.pop_front();
    if (m.bytes != x.bytes)
      fail(StatusCode::kInvalidUsage, "rank {}: received {} bytes from rank {} on channel {}, expected {}", rank_,
           m.bytes, x.peer, x.channel, x.bytes);
    if (x.bytes) std::memcpy(x.buf, m.src ? m.src : m.copy.data(), x.bytes);
    *x.done = true;
    if (!*m.sent) {
      *m.sent = true;
      w_.cvs_[m.sender].notify_all();
    }
  }
}

inline void ThreadLinks::start() {
  std::lock_guard<std::mutex> lock(w_.mu_);
  pump();
}

inline void ThreadLinks::waitFor(int h) {
  std::unique_lock<std::mutex> lock(w_.mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    pump();
    if (*handles_[h].done) return;
    if (w_.broken_) fail(StatusCode::kRemoteError, "rank {}: another rank failed", rank_);
    if (w_.cvs_[rank_].wait_until(lock, deadline) == std::cv_status::timeout && !*handles_[h].done)
      fail(StatusCode::kTimeout, "rank {}: {} rank {} on channel {} did not complete for 10 s", rank_,
           handles_[h].recv ? "the receive from" : "the send to", handles_[h].peer, handles_[h].channel);
  }
}

inline void ThreadLinks::wait(int h) { waitFor(h); }

inline void ThreadLinks::waitAll() {
  for (int h = 0; h < static_cast<int>(handles_.size()); ++h) waitFor(h);
  handles_.clear();
}

inline bool ThreadLinks::describeBuffer(const void* p, size_t bytes, progress::PeerBuffer* out) {
  if (!w_.mapping_ || !p) return false;
  *out = {};
  out->words[0] = 0x7468726561646d70ull;  // "threadmp"
  out->words[1] = reinterpret_cast<uint64_t>(p);
  out->words[7] = bytes;
  return true;
}

inline const char* ThreadLinks::mapPeerBuffer(int peer, const progress::PeerBuffer& b, size_t bytes) {
  if (!w_.mapping_ || peer == rank_ || b.words[0] != 0x7468726561646d70ull || b.words[7] != bytes) return nullptr;
  return reinterpret_cast<const char*>(b.words[1]);
}

}  // namespace topocoll::testing
