// The per-rank proxy thread (NCCL 2.30.7 src/proxy.cc's roles, our design): blocking calls from the rank's
// threads, the Unix socket that hands shareable buffers to peer processes, watching those peers, and progressing
// the network connections.
#include "topocoll/transport/proxy.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "os.h"
#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll::transport {

using Clock = std::chrono::steady_clock;

std::string proxySocketName(uint64_t commId, int rank) { return fmt::format("topocoll-{:016x}-{}", commId, rank); }

namespace {

constexpr uint64_t kRequestMagic = 0x74636f6c6c505832ULL;  // "tcollPX2"
enum RequestKind : uint32_t { kKindBuffer = 1, kKindDoorbellWatch = 2 };
constexpr char kLeftByte = 'D';  // sent on its watches by a proxy whose communicator is destroyed

#pragma pack(push, 1)
struct Request {
  uint64_t magic = kRequestMagic;
  uint64_t commId = 0;
  uint64_t key = 0;
  int32_t rank = -1;
  uint32_t kind = 0;
  uint32_t bufId = 0;
  uint32_t pad = 0;
};
struct Reply {
  int32_t status = 0;  // 0 ok, else refused
  uint32_t pad = 0;
  uint64_t size = 0;
};
#pragma pack(pop)

struct Exported {
  UniqueFd fd;
  MappedRegion mapping;
};

// A connection to our Unix socket whose request is still arriving.
struct Pending {
  UniqueFd sock;
  int pid = 0;        // of the connecting process (SO_PEERCRED)
  unsigned uid = 0;
  Request req;
  size_t got = 0;
  Clock::time_point since;
};

class EventWaker : public Waker {
 public:
  EventWaker(int efd, std::atomic<bool>* sleeping) : efd_(efd), sleeping_(sleeping) {}
  void ring() override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!sleeping_->load(std::memory_order_relaxed)) return;
    uint64_t one = 1;
    ssize_t r = ::write(efd_, &one, sizeof(one));
    (void)r;
  }

 private:
  int efd_;
  std::atomic<bool>* sleeping_;
};

}  // namespace

struct Proxy::Impl {
  Proxy* self = nullptr;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> sleeping{false};
  UniqueFd efd;
  std::unique_ptr<EventWaker> waker;
  UniqueFd listener;

  // Calls from other threads.
  struct Call {
    ProxyConnection* conn = nullptr;
    Msg msg = Msg::kSetup;
    const void* req = nullptr;
    size_t reqSize = 0;
    void* resp = nullptr;
    size_t respSize = 0;
    bool done = false;
    bool result = true;
    std::exception_ptr error;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Call*> calls;
  std::vector<std::shared_ptr<ProxyConnection>> toActivate;
  std::vector<ProxyConnection*> toDeactivate;
  std::vector<std::pair<UniqueFd, int>> newWatches;  // client-side sockets to the peers' proxies, with the peer

  // Proxy thread only.
  std::vector<std::shared_ptr<ProxyConnection>> active;
  std::map<uint32_t, Exported> exported;
  uint32_t nextBufId = 1;
  std::vector<Pending> pending;
  std::vector<std::pair<UniqueFd, int>> watches;  // socket, peer rank

  void run();
  bool runCalls();
  bool takeQueued();
  bool progressActive();
  void serveListener();
  void servePending(size_t i);
  void answer(Pending& p);
  void peerGone(int rank, uint8_t state, const char* how);
};

Proxy::Proxy(const Options& opts) : opts_(opts), impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.self = this;
  I.efd = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!I.efd.valid()) fail(StatusCode::kSystemError, "eventfd: {}", std::strerror(errno));
  I.waker = std::make_unique<EventWaker>(I.efd.get(), &I.sleeping);
  I.listener = os::listenUnix(proxySocketName(opts.commId, opts.rank));
  I.thread = std::thread([this] { impl_->run(); });
}

Proxy::~Proxy() {
  impl_->stop.store(true);
  uint64_t one = 1;
  ssize_t r = ::write(impl_->efd.get(), &one, sizeof(one));
  (void)r;
  if (impl_->thread.joinable()) impl_->thread.join();
  // The peers watching this process learn that its communicator ended, not its process (their errors say so).
  for (auto* list : {&impl_->watches, &impl_->newWatches})
    for (auto& w : *list) {
      const char left = kLeftByte;
      ssize_t sent = ::send(w.first.get(), &left, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)sent;
    }
  for (auto& c : impl_->active) {
    try {
      c->free(*this);
    } catch (const std::exception&) {
    }
  }
}

Waker& Proxy::waker() { return *impl_->waker; }

bool Proxy::callBlocking(ProxyConnection& conn, Msg msg, const void* req, size_t reqSize, void* resp,
                         size_t respSize) {
  Impl& I = *impl_;
  Impl::Call call;
  call.conn = &conn;
  call.msg = msg;
  call.req = req;
  call.reqSize = reqSize;
  call.resp = resp;
  call.respSize = respSize;
  {
    std::lock_guard<std::mutex> lock(I.mu);
    I.calls.push_back(&call);
  }
  uint64_t one = 1;
  ssize_t r = ::write(I.efd.get(), &one, sizeof(one));
  (void)r;
  std::unique_lock<std::mutex> lock(I.mu);
  I.cv.wait(lock, [&] { return call.done; });
  if (call.error) std::rethrow_exception(call.error);
  return call.result;
}

void Proxy::activate(std::shared_ptr<ProxyConnection> conn) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->toActivate.push_back(std::move(conn));
  }
  uint64_t one = 1;
  ssize_t r = ::write(impl_->efd.get(), &one, sizeof(one));
  (void)r;
}

void Proxy::deactivate(ProxyConnection* conn) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->toDeactivate.push_back(conn);
  }
  uint64_t one = 1;
  ssize_t r = ::write(impl_->efd.get(), &one, sizeof(one));
  (void)r;
}

ShareableBuffer Proxy::allocateShareable(size_t size, char** ptr) {
  Impl& I = *impl_;
  Exported e;
  e.fd = os::createMemfd("topocoll-buffer", size);
  e.mapping = MappedRegion::shared(e.fd.get(), size, "a shareable buffer");
  ShareableBuffer b;
  b.id = I.nextBufId++;
  b.size = size;
  b.ownerAddr = reinterpret_cast<uint64_t>(e.mapping.data());
  *ptr = e.mapping.data();
  TC_INFO(log::kAlloc | log::kP2p, "Proxy : rank {} allocated shareable buffer {} size {} ptr {}", opts_.rank, b.id,
          size, fmt::ptr(*ptr));
  I.exported.emplace(b.id, std::move(e));
  return b;
}

void Proxy::releaseShareable(uint32_t id) { impl_->exported.erase(id); }

namespace {

// Sends `req` to `owner`'s proxy and returns its answer and descriptor (owned).
UniqueFd ask(const Proxy::Options& o, int owner, Request req, Reply* rep, UniqueFd* keep) {
  std::string what = fmt::format("rank {} asking rank {}'s proxy for buffer {}", o.rank, owner, req.bufId);
  UniqueFd s = os::connectUnix(proxySocketName(o.commId, owner), what);
  // The socket's name is public: whoever listens on it must be the owner's process, of this user (a process of
  // another user squatting the name would otherwise be handed this rank's data, or hand it memory of its own).
  int pid = 0;
  unsigned uid = 0;
  if (!os::peerCredentials(s.get(), &pid, &uid))
    fail(StatusCode::kRemoteError, "{}: the kernel does not say who listens on the socket", what);
  const int want = static_cast<size_t>(owner) < o.pids.size() ? o.pids[owner] : 0;
  if (uid != ::geteuid() || (want > 0 && pid > 0 && pid != want))
    fail(StatusCode::kRemoteError,
         "{}: the socket is held by process {} of user {}, not by rank {}'s process {} of user {}: refused", what,
         pid, uid, owner, want, ::geteuid());
  auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(o.timeout, std::chrono::seconds(60));
  os::sendMsg(s.get(), &req, sizeof(req), -1, deadline, what);
  UniqueFd fd(os::recvMsg(s.get(), rep, sizeof(*rep), deadline, what));
  if (rep->status != 0 || !fd.valid())
    fail(StatusCode::kRemoteError, "rank {}: rank {}'s proxy refused buffer {} (status {})", o.rank, owner, req.bufId,
         rep->status);
  if (keep) *keep = std::move(s);
  return fd;
}

}  // namespace

MappedRegion Proxy::importShareable(int owner, const ShareableBuffer& b) {
  if (owner < 0 || owner >= opts_.nRanks) fail(StatusCode::kInvalidArgument, "import from rank {} of {}", owner, opts_.nRanks);
  Request req;
  req.commId = opts_.commId;
  req.key = opts_.key;
  req.rank = opts_.rank;
  req.kind = kKindBuffer;
  req.bufId = b.id;
  Reply rep;
  UniqueFd fd = ask(opts_, owner, req, &rep, nullptr);
  if (rep.size != b.size || os::fileSize(fd.get()) < b.size)
    fail(StatusCode::kRemoteError, "rank {}: buffer {} of rank {} has {} bytes, the connect record says {}", opts_.rank,
         b.id, owner, rep.size, b.size);
  MappedRegion m = MappedRegion::shared(fd.get(), b.size, "a peer's shareable buffer");
  TC_INFO(log::kP2p, "Proxy : rank {} imported buffer {} of rank {} size {} ptr {}", opts_.rank, b.id, owner, b.size,
          fmt::ptr(m.data()));
  return m;
}

std::shared_ptr<Doorbell> Proxy::importDoorbell(int owner) {
  if (owner < 0 || owner >= opts_.nRanks) fail(StatusCode::kInvalidArgument, "import from rank {} of {}", owner, opts_.nRanks);
  Request req;
  req.commId = opts_.commId;
  req.key = opts_.key;
  req.rank = opts_.rank;
  req.kind = kKindDoorbellWatch;
  Reply rep;
  UniqueFd sock;
  UniqueFd fd = ask(opts_, owner, req, &rep, &sock);
  auto bell = Doorbell::fromFd(fd.release());
  Reply evRep;
  int ev = os::recvMsg(sock.get(), &evRep, sizeof(evRep),
                       Clock::now() + std::min<std::chrono::milliseconds>(opts_.timeout, std::chrono::seconds(60)),
                       fmt::format("rank {} importing rank {}'s doorbell", opts_.rank, owner));
  if (ev >= 0) bell->adoptEventFd(ev);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->newWatches.emplace_back(std::move(sock), owner);
  }
  uint64_t one = 1;
  ssize_t r = ::write(impl_->efd.get(), &one, sizeof(one));
  (void)r;
  return bell;
}

// ---------------------------------------------------------------------------------------------------------------
// The thread

bool Proxy::Impl::runCalls() {
  bool did = false;
  while (true) {
    Call* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (calls.empty()) break;
      c = calls.front();
      calls.pop_front();
    }
    try {
      switch (c->msg) {
        case Msg::kSetup: c->conn->setup(*self, c->req, c->reqSize, c->resp, c->respSize); break;
        case Msg::kConnect: c->result = c->conn->connect(*self, c->req, c->reqSize, c->resp, c->respSize); break;
        case Msg::kFree: {
          // Out of the active list and out of the queue of connections to activate: a connection activated just
          // before it is freed must not be progressed after its network comms are gone.
          auto same = [&](const std::shared_ptr<ProxyConnection>& a) { return a.get() == c->conn; };
          active.erase(std::remove_if(active.begin(), active.end(), same), active.end());
          {
            std::lock_guard<std::mutex> lock(mu);
            toActivate.erase(std::remove_if(toActivate.begin(), toActivate.end(), same), toActivate.end());
          }
          c->conn->free(*self);
          break;
        }
      }
    } catch (...) {
      c->error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      c->done = true;
    }
    cv.notify_all();
    did = true;
  }
  return did;
}

bool Proxy::Impl::takeQueued() {
  std::lock_guard<std::mutex> lock(mu);
  bool did = !toActivate.empty() || !toDeactivate.empty() || !newWatches.empty();
  for (auto& c : toActivate) active.push_back(std::move(c));
  toActivate.clear();
  for (ProxyConnection* c : toDeactivate)
    for (auto it = active.begin(); it != active.end(); ++it)
      if (it->get() == c) {
        active.erase(it);
        break;
      }
  toDeactivate.clear();
  for (auto& w : newWatches) watches.push_back(std::move(w));
  newWatches.clear();
  return did;
}

bool Proxy::Impl::progressActive() {
  bool did = false;
  for (size_t i = 0; i < active.size();) {
    try {
      did |= active[i]->progress(*self);
      ++i;
    } catch (const std::exception& e) {
      active[i]->failed(e.what());  // it says how bad it is
      active.erase(active.begin() + static_cast<long>(i));
      did = true;
    }
  }
  return did;
}

void Proxy::Impl::peerGone(int rank, uint8_t state, const char* how) {
  auto& gone = self->opts_.peerGone;
  if (gone && rank >= 0 && rank < static_cast<int>(gone->size()) && !(*gone)[rank].exchange(state)) {
    TC_INFO(log::kInit | log::kProxy, "Proxy : rank {}: {} ({})", self->opts_.rank, peerGoneWhy(rank, state), how);
    if (self->opts_.doorbell) self->opts_.doorbell->ring();
  }
}

void Proxy::Impl::serveListener() {
  while (true) {
    int c = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    Pending p;
    p.sock = UniqueFd(c);
    // Another user's process is dropped before it can send anything (the name is public: /proc/net/unix).
    if (!os::peerCredentials(c, &p.pid, &p.uid) || p.uid != ::geteuid()) {
      TC_WARN("Proxy : rank {} dropped a connection from process {} of user {} (this job's user is {})",
              self->opts_.rank, p.pid, p.uid, ::geteuid());
      continue;
    }
    p.since = Clock::now();
    pending.push_back(std::move(p));
    servePending(pending.size() - 1);
  }
}

void Proxy::Impl::servePending(size_t i) {
  Pending& p = pending[i];
  while (p.got < sizeof(Request)) {
    ssize_t n = ::recv(p.sock.get(), reinterpret_cast<char*>(&p.req) + p.got, sizeof(Request) - p.got, 0);
    if (n > 0) {
      p.got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;  // later
    pending.erase(pending.begin() + static_cast<long>(i));     // closed before a full request
    return;
  }
  Pending done = std::move(p);
  pending.erase(pending.begin() + static_cast<long>(i));
  answer(done);
}

void Proxy::Impl::answer(Pending& p) {
  const Options& o = self->opts_;
  const Request& r = p.req;
  std::string why;
  int fd = -1;
  uint64_t size = 0;
  if (r.magic != kRequestMagic) why = "wrong magic";
  else if (r.commId != o.commId) why = fmt::format("communicator {:x} is not ours", r.commId);
  else if (r.key != o.key) why = "wrong key (not a rank of this job)";
  else if (r.rank < 0 || r.rank >= o.nRanks) why = fmt::format("rank {} out of range", r.rank);
  else if (static_cast<size_t>(r.rank) < o.pids.size() && o.pids[r.rank] > 0 && p.pid > 0 && p.pid != o.pids[r.rank])
    why = fmt::format("process {} is not rank {}'s ({})", p.pid, r.rank, o.pids[r.rank]);
  else if (r.kind == kKindDoorbellWatch) {
    if (!o.doorbell) why = "no doorbell";
    else fd = o.doorbell->fd(), size = sizeof(DoorbellPage);
  } else if (r.kind == kKindBuffer) {
    auto it = exported.find(r.bufId);
    if (it == exported.end()) why = fmt::format("no buffer {}", r.bufId);
    else fd = it->second.fd.get(), size = it->second.mapping.size();
  } else {
    why = fmt::format("unknown request {}", r.kind);
  }
  Reply rep;
  rep.status = why.empty() ? 0 : 1;
  rep.size = size;
  if (!why.empty()) TC_WARN("Proxy : rank {} refused a request of process {}: {}", o.rank, p.pid, why);
  try {
    os::sendMsg(p.sock.get(), &rep, sizeof(rep), why.empty() ? fd : -1, Clock::now() + std::chrono::seconds(2),
                "answering a proxy request");
    // A doorbell's eventfd follows its page (one descriptor a message): a ring that finds a poller writes it.
    if (why.empty() && r.kind == kKindDoorbellWatch)
      os::sendMsg(p.sock.get(), &rep, sizeof(rep), o.doorbell->eventFd(), Clock::now() + std::chrono::seconds(2),
                  "sending the doorbell's eventfd");
  } catch (const Error& e) {
    TC_WARN("Proxy : rank {}: {}", o.rank, e.what());
    return;
  }
  if (why.empty() && r.kind == kKindDoorbellWatch) watches.emplace_back(std::move(p.sock), r.rank);
}

void Proxy::Impl::run() {
  log::setThreadRank(self->opts_.rank);
  std::vector<pollfd> fds;
  while (!stop.load()) {
    bool did = runCalls();
    did |= takeQueued();
    did |= progressActive();
    if (did) continue;
    // Nothing to do: block in poll() at once (no yield, no spin). A proxy that yields or spins re-reads its
    // sockets (failed recvfrom calls) and, against CPU-bound processes, waits out their time slices; blocked in
    // poll() it is woken by the kernel as data is queued, or by the engine's eventfd once `sleeping` is set.
    // A 20 us spin here made NET's 8 B pingpong 191 us against 23 us without it (docs/transport.md, NET).
    sleeping.store(true, std::memory_order_seq_cst);
    // What the engine published before it could see `sleeping` (it rings only a sleeping proxy).
    if (!active.empty() && progressActive()) {
      sleeping.store(false, std::memory_order_relaxed);
      continue;
    }
    fds.clear();
    fds.push_back({efd.get(), POLLIN, 0});
    fds.push_back({listener.get(), POLLIN, 0});
    size_t pendingAt = fds.size();
    for (auto& p : pending) fds.push_back({p.sock.get(), POLLIN, 0});
    size_t watchAt = fds.size();
    for (auto& w : watches) fds.push_back({w.first.get(), POLLIN, 0});
    size_t connAt = fds.size();
    for (auto& c : active) c->pollFds(fds);
    // Connections that wait only for the engine (or are quiet, or a caller's) add no fd: the engine rings efd.
    int timeoutMs = active.empty() ? 200 : 50;
    int n = ::poll(fds.data(), fds.size(), timeoutMs);
    sleeping.store(false, std::memory_order_relaxed);
    if (n <= 0) continue;
    if (fds[0].revents) {
      uint64_t v;
      while (::read(efd.get(), &v, sizeof(v)) > 0) {
      }
    }
    if (fds[1].revents) serveListener();
    for (size_t i = watchAt; i-- > pendingAt;)
      if (fds[i].revents && i - pendingAt < pending.size()) servePending(i - pendingAt);
    for (size_t i = connAt; i-- > watchAt;) {
      if (!fds[i].revents) continue;
      size_t w = i - watchAt;
      char buf[64];
      ssize_t got = ::recv(watches[w].first.get(), buf, sizeof(buf), 0);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      // The one byte ever sent on a watch: the peer's proxy ending with its communicator (kLeftByte), its process
      // alive; a close without it: the process is gone.
      if (got > 0 && std::memchr(buf, kLeftByte, static_cast<size_t>(got)) == nullptr) continue;
      // What the peer sent before it left may be in this poll's data too: moved first, so that its ops end as done.
      progressActive();
      if (got > 0) peerGone(watches[w].second, kPeerLeftComm, "its communicator was destroyed");
      else peerGone(watches[w].second, kPeerProcessGone, "its proxy connection closed");
      watches.erase(watches.begin() + static_cast<long>(w));
    }
    // Requests that never completed: drop after a few seconds.
    auto now = Clock::now();
    for (size_t i = pending.size(); i-- > 0;)
      if (now - pending[i].since > std::chrono::seconds(5)) {
        TC_WARN("Proxy : rank {} dropped an incomplete request", self->opts_.rank);
        pending.erase(pending.begin() + static_cast<long>(i));
      }
  }
}

}  // namespace topocoll::transport
