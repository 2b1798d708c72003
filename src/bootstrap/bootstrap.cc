// TCP bootstrap: root rendezvous, ring, ring allgather and tagged point-to-point messages (NCCL's bootstrap.cc
// design, our code). Every connection starts with a header carrying the job's magic and the sender's rank;
// anything else is dropped and logged, never trusted.
#include "topocoll/bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <poll.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "socket.h"
#include "wire.h"
#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll::bootstrap {

namespace {

constexpr int32_t kTagRegister = -1, kTagRing = -2, kTagError = -3, kTagBcast = -5;

#pragma pack(push, 1)
struct WireAddr {
  uint16_t family = 0;
  uint16_t port = 0;  // network order
  uint8_t addr[16] = {};
};
struct Registration {
  WireAddr listen;
  int32_t nRanks = 0;
  int64_t timeoutMs = 0;  // the rank's bootstrap timeout: the root reports missing ranks a little before it
};
#pragma pack(pop)

WireAddr toWire(const Address& a) {
  WireAddr w;
  w.family = a.storage.ss_family;
  if (w.family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a.storage);
    w.port = s->sin_port;
    std::memcpy(w.addr, &s->sin_addr, 4);
  } else {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    w.port = s->sin6_port;
    std::memcpy(w.addr, &s->sin6_addr, 16);
  }
  return w;
}

Address fromWire(const WireAddr& w) {
  Address a;
  if (w.family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.storage);
    s->sin_family = AF_INET;
    s->sin_port = w.port;
    std::memcpy(&s->sin_addr, w.addr, 4);
    a.len = sizeof(sockaddr_in);
  } else if (w.family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.storage);
    s->sin6_family = AF_INET6;
    s->sin6_port = w.port;
    std::memcpy(&s->sin6_addr, w.addr, 16);
    a.len = sizeof(sockaddr_in6);
  } else {
    fail(StatusCode::kInvalidArgument, "bootstrap: address family {} in a unique id or message", w.family);
  }
  return a;
}

bool isLoopback(const Address& a) {
  if (a.storage.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr) >> 24) == 127;
  return a.storage.ss_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr);
}

// A stranger or a broken peer: the job goes on without it, and NCCL_DEBUG=WARN says why.
void logDropped(const std::string& why) { TC_WARN("Bootstrap : dropped a connection: {}", why); }

}  // namespace

std::string checkHeader(const Header& h, uint64_t magic, int nRanks, size_t maxBytes) {
  if (h.magic != magic) return "wrong magic";
  if (h.rank < 0 || h.rank >= nRanks) return "sender rank " + std::to_string(h.rank) + " out of range";
  if (h.size > maxBytes) return "message of " + std::to_string(h.size) + " bytes is over the limit";
  return "";
}

bool decodeMessage(std::string_view bytes, uint64_t magic, int nRanks, size_t maxBytes, DecodedMessage* out,
                   std::string* why) {
  Header h;
  if (bytes.size() < sizeof(h)) {
    *why = "truncated header";
    return false;
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  *why = checkHeader(h, magic, nRanks, maxBytes);
  if (!why->empty()) return false;
  if (bytes.size() - sizeof(h) != h.size) {
    *why = "body of " + std::to_string(bytes.size() - sizeof(h)) + " bytes, header says " + std::to_string(h.size);
    return false;
  }
  out->rank = h.rank;
  out->tag = h.tag;
  out->body.assign(bytes.begin() + sizeof(h), bytes.end());
  return true;
}

void Bootstrap::barrier() {
  std::vector<uint8_t> v(nRanks());
  allGather(v.data(), 1);
}

void Bootstrap::broadcast(int root, void* data, size_t size) {
  if (root < 0 || root >= nRanks()) fail(StatusCode::kInvalidArgument, "broadcast root {} out of range", root);
  if (rank() == root) {
    for (int r = 0; r < nRanks(); ++r)
      if (r != root) send(r, kTagBcast, data, size);
  } else {
    recv(root, kTagBcast, data, size);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Root

class Root {
 public:
  Root(const Address& bindAddr, uint64_t magic) {
    listener_ = Socket::listen(bindAddr, &addr_);
    std::random_device rd;
    magic_ = magic ? magic : (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0x746f706f636f6c6cULL;
    thread_ = std::thread([this] { run(); });
  }
  ~Root() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  Address address() const { return addr_; }
  uint64_t magic() const { return magic_; }

 private:
  void run() {
    // Until every rank of the job has registered, then answer each with its ring neighbour. The job size and the
    // timeout come with the first registration; when the timeout nears, the registered ranks are told which ranks
    // never came.
    struct Reg {
      Socket sock;
      WireAddr listen;
      int rank;
    };
    std::vector<Reg> regs;
    int nRanks = -1;
    auto deadline = Clock::now() + std::chrono::hours(24);
    try {
      while (nRanks < 0 || static_cast<int>(regs.size()) < nRanks) {
        Socket c;
        try {
          c = listener_.accept(deadline, &stop_, "waiting for ranks to register");
        } catch (const Error& e) {
          if (e.code() == StatusCode::kTimeout) reportMissing(regs.size(), nRanks, [&](int i) -> Socket& { return regs[i].sock; },
                                                             [&](int i) { return regs[i].rank; });
          return;
        }
        Header h;
        Registration r;
        try {
          auto d = Clock::now() + std::chrono::seconds(10);
          c.recvAll(&h, sizeof(h), d, &stop_, "reading a registration");
          if (h.magic != magic_ || h.tag != kTagRegister || h.size != sizeof(r)) {
            logDropped("root: wrong magic or not a registration");
            continue;
          }
          c.recvAll(&r, sizeof(r), d, &stop_, "reading a registration");
        } catch (const Error& e) {
          logDropped(std::string("root: ") + e.what());
          continue;
        }
        if (r.nRanks <= 0 || h.rank < 0 || h.rank >= r.nRanks || (nRanks >= 0 && r.nRanks != nRanks)) {
          logDropped("root: rank or job size out of range");
          continue;
        }
        if (nRanks < 0 && r.timeoutMs > 0) {
          auto margin = std::chrono::milliseconds(std::max<int64_t>(r.timeoutMs / 10, 50));
          deadline = Clock::now() + std::chrono::milliseconds(r.timeoutMs) - margin;
        }
        nRanks = r.nRanks;
        regs.push_back(Reg{std::move(c), r.listen, h.rank});
      }
      std::vector<WireAddr> byRank(nRanks);
      for (auto& g : regs) byRank[g.rank] = g.listen;
      for (auto& g : regs) {
        Header h{magic_, -1, kTagRegister, sizeof(WireAddr)};
        auto d = Clock::now() + std::chrono::seconds(10);
        g.sock.sendAll(&h, sizeof(h), d, &stop_, "answering a registration");
        g.sock.sendAll(&byRank[(g.rank + 1) % nRanks], sizeof(WireAddr), d, &stop_, "answering a registration");
      }
    } catch (const Error& e) {
      TC_WARN("Bootstrap : root: {}", e.what());
    }
  }

  template <typename SockAt, typename RankAt>
  void reportMissing(size_t n, int nRanks, SockAt sockAt, RankAt rankAt) {
    std::vector<int> present(std::max(nRanks, 0), 0);
    for (size_t i = 0; i < n; ++i) present[rankAt(static_cast<int>(i))] = 1;
    std::string missing;
    for (int r = 0; r < nRanks; ++r)
      if (!present[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    std::string msg = "rank(s) " + missing + " of " + std::to_string(nRanks) + " never registered with the root";
    for (size_t i = 0; i < n; ++i) {
      try {
        Header h{magic_, -1, kTagError, msg.size()};
        auto d = Clock::now() + std::chrono::seconds(2);
        sockAt(static_cast<int>(i)).sendAll(&h, sizeof(h), d, nullptr, "reporting missing ranks");
        sockAt(static_cast<int>(i)).sendAll(msg.data(), msg.size(), d, nullptr, "reporting missing ranks");
      } catch (const Error&) {
      }
    }
  }

  Socket listener_;
  Address addr_;
  uint64_t magic_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

RootHandle::~RootHandle() = default;

UniqueId uniqueIdFor(const std::string& hostPort, uint64_t magic) {
  UniqueId id;
  WireAddr w = toWire(parseHostPort(hostPort));
  std::memcpy(id.bytes.data(), &magic, sizeof(magic));
  std::memcpy(id.bytes.data() + sizeof(magic), &w, sizeof(w));
  return id;
}

UniqueId createUniqueId(RootHandle* holder, const std::string& hostPort, uint64_t magic) {
  Address bind = hostPort.empty() ? defaultAddress() : parseHostPort(hostPort);
  auto root = std::make_shared<Root>(bind, magic);
  if (holder) holder->root = root;
  UniqueId id;
  uint64_t m = root->magic();
  WireAddr w = toWire(root->address());
  std::memcpy(id.bytes.data(), &m, sizeof(m));
  std::memcpy(id.bytes.data() + sizeof(m), &w, sizeof(w));
  return id;
}

// ---------------------------------------------------------------------------------------------------------------
// Ranks

struct TcpBootstrap::Impl {
  Options opts;
  uint64_t magic = 0;
  Socket listener;
  Address listenAddr;
  Socket next, prev;
  std::vector<WireAddr> peers;
  struct Pending {
    int rank, tag;
    std::vector<uint8_t> data;
  };
  std::deque<Pending> unexpected;
  std::mutex mu;  // one collective operation at a time

  Clock::time_point deadline() const { return Clock::now() + opts.timeout; }

  // Reads one incoming connection's message, validating it. Returns false when it was dropped.
  bool readMessage(Socket& c, int nRanks, Pending* out) {
    Header h;
    auto d = Clock::now() + std::min<std::chrono::milliseconds>(opts.timeout, std::chrono::seconds(10));
    try {
      c.recvAll(&h, sizeof(h), d, opts.abortFlag, "reading a message header");
      std::string why = checkHeader(h, magic, nRanks, opts.maxMessageBytes);
      if (!why.empty()) {
        logDropped(why);
        return false;
      }
      out->rank = h.rank;
      out->tag = h.tag;
      out->data.resize(h.size);
      if (h.size) c.recvAll(out->data.data(), h.size, d, opts.abortFlag, "reading a message body");
    } catch (const Error& e) {
      if (e.code() == StatusCode::kAborted) throw;
      logDropped(e.what());
      return false;
    }
    return true;
  }
};

std::unique_ptr<TcpBootstrap> TcpBootstrap::connect(const UniqueId& id, int rank, int nRanks, const Options& opts) {
  if (nRanks <= 0 || rank < 0 || rank >= nRanks)
    fail(StatusCode::kInvalidArgument, "bootstrap: rank {} of {} is out of range", rank, nRanks);
  std::unique_ptr<TcpBootstrap> bs(new TcpBootstrap());
  bs->rank_ = rank;
  bs->nRanks_ = nRanks;
  bs->impl_ = std::make_unique<Impl>();
  Impl& I = *bs->impl_;
  I.opts = opts;
  WireAddr rootW;
  std::memcpy(&I.magic, id.bytes.data(), sizeof(I.magic));
  std::memcpy(&rootW, id.bytes.data() + sizeof(I.magic), sizeof(rootW));
  Address root = fromWire(rootW);
  Address mine = isLoopback(root) && opts.socketIfname.empty() ? root : chooseAddress(opts.socketIfname, opts.socketFamily);
  if (mine.storage.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&mine.storage)->sin_port = 0;
  else reinterpret_cast<sockaddr_in6*>(&mine.storage)->sin6_port = 0;
  I.listener = Socket::listen(mine, &I.listenAddr);
  TC_INFO(log::kInit | log::kBootstrap, "Bootstrap : Using {} (root {})", I.listenAddr.toString(), root.toString());

  const auto deadline = I.deadline();
  std::string what = fmt::format("rank {} registering with the root at {}", rank, root.toString());
  Socket r = Socket::connect(root, deadline, opts.abortFlag, what);
  Header h{I.magic, rank, kTagRegister, sizeof(Registration)};
  Registration reg{toWire(I.listenAddr), nRanks, static_cast<int64_t>(opts.timeout.count())};
  r.sendAll(&h, sizeof(h), deadline, opts.abortFlag, what);
  r.sendAll(&reg, sizeof(reg), deadline, opts.abortFlag, what);
  WireAddr nextW;
  what = fmt::format("rank {} waiting for all {} ranks to register (some rank has not started)", rank, nRanks);
  r.recvAll(&h, sizeof(h), deadline, opts.abortFlag, what);
  if (h.magic == I.magic && h.tag == kTagError && h.size < 4096) {
    std::string msg(h.size, '\0');
    r.recvAll(msg.data(), msg.size(), deadline, opts.abortFlag, what);
    fail(StatusCode::kTimeout, "rank {}: bootstrap timed out: {}", rank, msg);
  }
  if (h.magic != I.magic || h.size != sizeof(WireAddr)) fail(StatusCode::kRemoteError, "bootstrap: bad answer from the root");
  r.recvAll(&nextW, sizeof(nextW), deadline, opts.abortFlag, what);

  // The ring: connect to next, accept prev (queueing anything else that arrives first).
  int next = (rank + 1) % nRanks, prev = (rank - 1 + nRanks) % nRanks;
  I.next = Socket::connect(fromWire(nextW), deadline, opts.abortFlag, fmt::format("connecting to rank {}", next));
  Header rh{I.magic, rank, kTagRing, 0};
  I.next.sendAll(&rh, sizeof(rh), deadline, opts.abortFlag, fmt::format("connecting to rank {}", next));
  while (!I.prev.valid()) {
    Socket c = I.listener.accept(deadline, opts.abortFlag, fmt::format("rank {} waiting for rank {} to join the ring", rank, prev));
    Impl::Pending m;
    if (!I.readMessage(c, nRanks, &m)) continue;
    if (m.tag == kTagRing && m.rank == prev) I.prev = std::move(c);
    else I.unexpected.push_back(std::move(m));
  }
  I.peers.resize(nRanks);
  I.peers[rank] = toWire(I.listenAddr);
  bs->allGather(I.peers.data(), sizeof(WireAddr));
  return bs;
}

TcpBootstrap::~TcpBootstrap() = default;

void TcpBootstrap::allGather(void* data, size_t size) {
  Impl& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mu);
  if (nRanks_ == 1 || size == 0) return;
  auto* base = static_cast<uint8_t*>(data);
  const auto deadline = I.deadline();
  int prev = (rank_ - 1 + nRanks_) % nRanks_;
  for (int i = 0; i < nRanks_ - 1; ++i) {
    int sendSlice = (rank_ - i + nRanks_) % nRanks_;
    int recvSlice = (rank_ - i - 1 + nRanks_) % nRanks_;
    // Send and receive together so that large slices cannot deadlock on full socket buffers.
    const uint8_t* sp = base + static_cast<size_t>(sendSlice) * size;
    uint8_t* rp = base + static_cast<size_t>(recvSlice) * size;
    size_t sent = 0, got = 0;
    std::string what = fmt::format("rank {} in allGather step {} (waiting for rank {})", rank_, i, prev);
    while (sent < size || got < size) {
      if (I.opts.abortFlag && I.opts.abortFlag->load()) fail(StatusCode::kAborted, "bootstrap aborted during {}", what);
      if (Clock::now() >= deadline) fail(StatusCode::kTimeout, "timeout: {}", what);
      pollfd p[2] = {{I.next.fd(), static_cast<short>(sent < size ? POLLOUT : 0), 0},
                     {I.prev.fd(), static_cast<short>(got < size ? POLLIN : 0), 0}};
      ::poll(p, 2, 100);
      if (sent < size && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
        ssize_t n = ::send(I.next.fd(), sp + sent, size - sent, MSG_NOSIGNAL);
        if (n > 0) sent += static_cast<size_t>(n);
        else if (n < 0 && errno != EAGAIN && errno != EINTR)
          fail(StatusCode::kRemoteError, "rank {}: connection to rank {} lost during allGather", rank_, (rank_ + 1) % nRanks_);
      }
      if (got < size && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
        ssize_t n = ::recv(I.prev.fd(), rp + got, size - got, 0);
        if (n > 0) got += static_cast<size_t>(n);
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
          fail(StatusCode::kRemoteError, "rank {}: rank {} left during allGather", rank_, prev);
      }
    }
  }
}

void TcpBootstrap::send(int peer, int tag, const void* data, size_t size) {
  Impl& I = *impl_;
  if (peer < 0 || peer >= nRanks_) fail(StatusCode::kInvalidArgument, "bootstrap send to rank {} of {}", peer, nRanks_);
  if (size > I.opts.maxMessageBytes) fail(StatusCode::kInvalidArgument, "bootstrap message of {} bytes is over the limit", size);
  const auto deadline = I.deadline();
  std::string what = fmt::format("rank {} sending tag {} to rank {}", rank_, tag, peer);
  Socket s = Socket::connect(fromWire(I.peers[peer]), deadline, I.opts.abortFlag, what);
  Header h{I.magic, rank_, tag, size};
  s.sendAll(&h, sizeof(h), deadline, I.opts.abortFlag, what);
  if (size) s.sendAll(data, size, deadline, I.opts.abortFlag, what);
}

void TcpBootstrap::recv(int peer, int tag, void* data, size_t size) {
  Impl& I = *impl_;
  if (peer < 0 || peer >= nRanks_) fail(StatusCode::kInvalidArgument, "bootstrap recv from rank {} of {}", peer, nRanks_);
  auto take = [&](Impl::Pending& m) {
    if (m.data.size() != size)
      fail(StatusCode::kRemoteError, "rank {}: message tag {} from rank {} has {} bytes, {} expected", rank_, tag, peer,
           m.data.size(), size);
    if (size) std::memcpy(data, m.data.data(), size);
  };
  for (auto it = I.unexpected.begin(); it != I.unexpected.end(); ++it) {
    if (it->rank == peer && it->tag == tag) {
      take(*it);
      I.unexpected.erase(it);
      return;
    }
  }
  const auto deadline = I.deadline();
  std::string what = fmt::format("rank {} waiting for tag {} from rank {}", rank_, tag, peer);
  while (true) {
    Socket c = I.listener.accept(deadline, I.opts.abortFlag, what);
    Impl::Pending m;
    if (!I.readMessage(c, nRanks_, &m)) continue;
    if (m.rank == peer && m.tag == tag) {
      take(m);
      return;
    }
    I.unexpected.push_back(std::move(m));
  }
}

}  // namespace topocoll::bootstrap
