// All ranks in one process: the bootstrap for unit tests of multi-rank logic (threads, no sockets).
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/status.h"

namespace topocoll::bootstrap {

class InMemoryGroup {
 public:
  InMemoryGroup(int n, Options o) : n_(n), opts_(o) {}
  int n_;
  Options opts_;
  std::mutex mu;
  std::condition_variable cv;
  // allGather rounds: contributions of the current round, and a generation counter.
  std::vector<uint8_t> gather;
  int arrived = 0, leaving = 0;
  uint64_t generation = 0;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<uint8_t>>> mail;  // (src, dst, tag)
  AuthKey key = AuthKey::random();  // the group's secret (childKey)
  std::string failure;  // set by abort(): every wait fails with it
  int failedRank = -1;  // whose abort() set it

  template <typename Pred>
  // `survivor`: neither the group's failure nor the abort flag ends the wait (Bootstrap::recvSurvivor).
  void wait(std::unique_lock<std::mutex>& lock, Pred pred, const std::string& what, bool survivor = false) {
    auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
    while (!pred()) {
      if (!survivor && !failure.empty()) fail(StatusCode::kRemoteError, "{}", failure);
      if (!survivor && opts_.abortFlag && opts_.abortFlag->load())
        fail(StatusCode::kAborted, "bootstrap aborted while {}", what);
      if (cv.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50))) ==
              std::cv_status::timeout &&
          std::chrono::steady_clock::now() >= deadline && !pred())
        fail(StatusCode::kTimeout, "timeout while {}", what);
    }
  }
};

namespace {

class InMemoryBootstrap : public Bootstrap {
 public:
  InMemoryBootstrap(std::shared_ptr<InMemoryGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int nRanks() const override { return g_->n_; }
  AuthKey childKey(std::string_view context) const override { return g_->key.child(context); }

  void allGather(void* data, size_t size) override {
    std::unique_lock<std::mutex> lock(g_->mu);
    auto& G = *g_;
    G.wait(lock, [&] { return G.leaving == 0; }, "waiting for the previous allGather to finish");
    if (G.arrived == 0) G.gather.assign(static_cast<size_t>(G.n_) * size, 0);
    std::memcpy(G.gather.data() + static_cast<size_t>(rank_) * size, static_cast<uint8_t*>(data) + rank_ * size, size);
    uint64_t gen = G.generation;
    if (++G.arrived == G.n_) {
      G.arrived = 0;
      G.leaving = G.n_;
      G.generation++;
      G.cv.notify_all();
    } else {
      G.wait(lock, [&] { return G.generation != gen; },
             fmt::format("rank {} in allGather ({} of {} ranks arrived)", rank_, G.arrived, G.n_));
    }
    std::memcpy(data, G.gather.data(), static_cast<size_t>(G.n_) * size);
    if (--G.leaving == 0) G.cv.notify_all();
  }

  void send(int peer, int tag, const void* data, size_t size) override {
    if (peer < 0 || peer >= g_->n_) fail(StatusCode::kInvalidArgument, "send to rank {} of {}", peer, g_->n_);
    std::lock_guard<std::mutex> lock(g_->mu);
    auto* p = static_cast<const uint8_t*>(data);
    g_->mail[{rank_, peer, tag}].emplace_back(p, p + size);
    g_->cv.notify_all();
  }

  void recv(int peer, int tag, void* data, size_t size) override { receive(peer, tag, data, size, false); }
  void recvSurvivor(int peer, int tag, void* data, size_t size) override { receive(peer, tag, data, size, true); }
  void receive(int peer, int tag, void* data, size_t size, bool survivor) {
    if (peer < 0 || peer >= g_->n_) fail(StatusCode::kInvalidArgument, "recv from rank {} of {}", peer, g_->n_);
    std::unique_lock<std::mutex> lock(g_->mu);
    auto key = std::make_tuple(peer, rank_, tag);
    g_->wait(lock, [&] { return !g_->mail[key].empty(); },
             fmt::format("rank {} waiting for tag {} from rank {}", rank_, tag, peer), survivor);
    auto msg = std::move(g_->mail[key].front());
    g_->mail[key].pop_front();
    if (msg.size() != size)
      fail(StatusCode::kRemoteError, "rank {}: message tag {} from rank {} has {} bytes, {} expected", rank_, tag, peer,
           msg.size(), size);
    std::memcpy(data, msg.data(), size);
  }

  void setPhase(const std::string& phase) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    phase_ = phase;
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->failure.empty()) {
      g_->failure = fmt::format("rank {} failed during {}: {}", rank_, phase_, reason);
      g_->failedRank = rank_;
    }
    g_->cv.notify_all();
  }

  bool tryRecvAny(int tag, int* from, void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    for (auto& [key, q] : g_->mail) {
      auto [src, dst, t] = key;
      if (dst != rank_ || t != tag) continue;
      while (!q.empty() && q.front().size() != size) q.pop_front();
      if (q.empty()) continue;
      *from = src;
      if (size) std::memcpy(data, q.front().data(), size);
      q.pop_front();
      return true;
    }
    return false;
  }

  bool hasMessage(int peer, int tag) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    auto it = g_->mail.find({peer, rank_, tag});
    return it != g_->mail.end() && !it->second.empty();
  }

  bool failedElsewhere(std::string* why, std::chrono::milliseconds wait) override {
    std::unique_lock<std::mutex> lock(g_->mu);
    g_->cv.wait_for(lock, wait, [&] { return !g_->failure.empty(); });
    if (g_->failure.empty() || g_->failedRank == rank_) return false;
    *why = g_->failure;
    return true;
  }

 private:
  std::shared_ptr<InMemoryGroup> g_;
  int rank_;
  std::string phase_ = "communicator init";
};

}  // namespace

std::vector<std::unique_ptr<Bootstrap>> makeInMemoryGroup(int nRanks, const Options& opts) {
  if (nRanks <= 0) fail(StatusCode::kInvalidArgument, "in-memory bootstrap needs at least one rank");
  auto g = std::make_shared<InMemoryGroup>(nRanks, opts);
  std::vector<std::unique_ptr<Bootstrap>> out;
  for (int r = 0; r < nRanks; ++r) out.push_back(std::make_unique<InMemoryBootstrap>(g, r));
  return out;
}

}  // namespace topocoll::bootstrap
