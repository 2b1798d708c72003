// NCCL's internal socket network plugin (NCCL 2.30.7 src/transport/net_socket.cc design: a control socket carrying
// each message's size and small payloads inline, optional helper threads each driving NCCL_NSOCKS_PERTHREAD data
// sockets that a message is split over in tasks of at least 64 KiB), Apache-2.0; our own code. Helper threads
// sleep in poll() when their sockets would block instead of spinning.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "os.h"
#include "topocoll/auth.h"
#include "topocoll/log.h"
#include "topocoll/netif.h"
#include "topocoll/socket.h"
#include "topocoll/status.h"
#include "topocoll/transport/net.h"

namespace topocoll::transport {

namespace {

constexpr int kMaxSockets = 64, kMaxThreads = 16, kMaxRequests = 32;
constexpr size_t kInline = 128;          // NCCL_SOCKET_INLINE
constexpr size_t kMinTask = 64 << 10;    // NCCL_SOCKET_MIN_TASKSIZE
constexpr uint32_t kCtrlIndex = 0xffffffff;

#pragma pack(push, 1)
// The listener's connect handle, sent to the connecting rank over the (authenticated) bootstrap. `key` is the
// listener's own random secret: every connection proves it holds it (auth.h), so a stranger who reaches the port
// is dropped, and the key itself never crosses the connection.
struct Handle {
  uint8_t key[32] = {};
  uint8_t nSocks = 0, nThreads = 0;
  uint8_t pad[2] = {};
  WireAddr addr;
};
// The first message of an authenticated connection: which of the listener's sockets it is.
struct Hello {
  uint32_t index;
};
#pragma pack(pop)
static_assert(sizeof(Handle) <= kNetHandleSize, "socket handle too large");

SocketAddress peerOf(const Handle& h) {
  SocketAddress a;
  if (!SocketAddress::fromWire(h.addr, &a))
    fail(StatusCode::kRemoteError, "NET/Socket : a connect handle carries address family {}", h.addr.family);
  return a;
}

// NCCL's way of writing an address in its messages: "10.0.0.1<29500>".
std::string addrString(const SocketAddress& a) { return fmt::format("{}<{}>", a.host(), a.port()); }

// Non-blocking send or receive of what is left of [p, p+size); returns false on EAGAIN, throws when the peer is gone.
// `more`: the payload follows at once (MSG_MORE lets the kernel put both in one segment).
bool ioStep(bool send, Socket& s, char* p, size_t size, size_t* offset, const char* peer, bool more = false) {
  IoStatus st = send ? s.sendSome(p, size, offset, more) : s.recvSome(p, size, offset);
  if (st.broken()) fail(StatusCode::kRemoteError, "NET/Socket : connection with {} {}", peer, st.why());
  return st.done();
}

// One piece of a message on one data socket, moved by a helper thread.
struct Task {
  bool send = false;
  char* data = nullptr;
  size_t size = 0, offset = 0;
  Socket* sock = nullptr;
  std::atomic<bool> done{false};
  std::string error;
};

struct SocketComm;

// A helper thread (NCCL_SOCKET_NTHREADS): moves the tasks of its sockets in order, sleeping in poll() when they
// would block and on a condition variable when it has none.
class Helper {
 public:
  Helper(SocketComm* comm, std::vector<int> socks);
  ~Helper();
  void add(Task* t);

 private:
  void run();
  SocketComm* comm_;
  std::vector<int> socks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task*> queue_;
  bool stop_ = false;
  UniqueFd wake_;
  std::thread thread_;
};

struct Request : NetRequest {
  SocketComm* comm = nullptr;
  int state = 0;  // 0 free, 1 exchanging the size, 2 moving the payload
  bool send = false;
  char* data = nullptr;
  size_t size = 0;
  uint32_t ctrl[1 + kInline / 4] = {};
  size_t ctrlOff = 0, offset = 0;
  uint64_t seq = 0;  // a send's place among its comm's sends
  std::vector<std::unique_ptr<Task>> tasks;
};

struct SocketComm : NetComm {
  std::string peer;     // for messages
  Socket ctrl;
  std::vector<Socket> socks;
  int nThreads = 0;
  std::array<Request, kMaxRequests> requests;
  uint64_t sends = 0;  // sends posted so far
  int nextSock = 0;
  UniqueFd done;  // eventfd the helpers write when a task finishes (the proxy polls it)
  std::vector<std::unique_ptr<Helper>> helpers;
  ~SocketComm() override { helpers.clear(); }
};

Helper::Helper(SocketComm* comm, std::vector<int> socks) : comm_(comm), socks_(std::move(socks)) {
  wake_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  thread_ = std::thread([this] { run(); });
}

Helper::~Helper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  uint64_t one = 1;
  ssize_t r = ::write(wake_.get(), &one, sizeof(one));
  (void)r;
  thread_.join();
}

void Helper::add(Task* t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(t);
  }
  cv_.notify_one();
  uint64_t one = 1;
  ssize_t r = ::write(wake_.get(), &one, sizeof(one));
  (void)r;
}

void Helper::run() {
  std::vector<pollfd> fds;
  while (true) {
    std::vector<Task*> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      work.assign(queue_.begin(), queue_.end());
    }
    // The oldest task of each socket advances; the others wait their turn (the peer reads them in the same order).
    bool moved = false, pendingAny = false;
    fds.clear();
    std::vector<Socket*> seen;
    for (Task* t : work) {
      if (std::find(seen.begin(), seen.end(), t->sock) != seen.end()) continue;
      seen.push_back(t->sock);
      pendingAny = true;
      size_t before = t->offset;
      try {
        ioStep(t->send, *t->sock, t->data, t->size, &t->offset, comm_->peer.c_str());
      } catch (const Error& e) {
        t->error = e.what();
        t->offset = t->size;
      }
      moved |= t->offset != before;
      if (t->offset == t->size) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          queue_.erase(std::find(queue_.begin(), queue_.end(), t));
        }
        t->done.store(true, std::memory_order_release);
        uint64_t one = 1;
        ssize_t r = ::write(comm_->done.get(), &one, sizeof(one));
        (void)r;
      } else {
        fds.push_back({t->sock->fd(), static_cast<short>(t->send ? POLLOUT : POLLIN), 0});
      }
    }
    if (!moved && pendingAny && !fds.empty()) {
      fds.push_back({wake_.get(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), 100);
      uint64_t v;
      while (::read(wake_.get(), &v, sizeof(v)) > 0) {
      }
    }
  }
}

struct ListenComm : NetComm {
  int dev = 0;
  Socket sock;
  AuthKey key;
  int nSocks = 0, nThreads = 0;
  struct Incoming {
    Socket sock;
    Handshake auth;
    Hello hello{};
    size_t got = 0;
  };
  std::vector<Incoming> incoming;
  Socket ctrl;
  std::vector<Socket> socks;
};

struct ConnectState : NetComm {
  std::vector<Socket> socks;  // [ctrl, data...]
  std::vector<Handshake> auth;
  std::vector<size_t> sent;
  Handle handle;
};

AuthKey keyOf(const Handle& h) {
  AuthKey k;
  std::memcpy(k.bytes.data(), h.key, sizeof(h.key));
  return k;
}

class SocketNet : public Net {
 public:
  explicit SocketNet(const Config& cfg) {
    ifs_ = netif::findInterfaces(cfg.socketIfname, cfg.socketFamily, cfg.commId);
    if (ifs_.empty())
      fail(StatusCode::kInvalidArgument, "NET/Socket : no interface found (NCCL_SOCKET_IFNAME={}, NCCL_SOCKET_FAMILY={})",
           cfg.socketIfname, cfg.socketFamily);
    std::string line;
    for (size_t i = 0; i < ifs_.size(); ++i) {
      line += fmt::format(" [{}]{}:{}", i, ifs_[i].name, addrString(SocketAddress::from(ifs_[i].addr, ifs_[i].len)));
    }
    TC_INFO(log::kInit | log::kNet, "NET/Socket : Using{}", line);
    trafficClass_ = cfg.trafficClass;
    pacingMbps_ = cfg.socketPacing;
    for (const auto& i : ifs_) statedMbps_.push_back(netif::statedSpeedMbps(i.name));
    nThreads_ = cfg.socketNthreads == -2 ? 0 : std::min(cfg.socketNthreads, kMaxThreads);
    int perThread = cfg.nsocksPerThread == -2 ? 1 : cfg.nsocksPerThread;
    nSocks_ = nThreads_ * perThread;
    if (nSocks_ > kMaxSockets) {
      perThread = kMaxSockets / nThreads_;
      TC_WARN("NET/Socket : the total number of sockets is greater than the maximum allowed, setting "
              "NCCL_NSOCKS_PERTHREAD to {}", perThread);
      nSocks_ = nThreads_ * perThread;
    }
    if (nSocks_ > 0)
      TC_INFO(log::kInit, "NET/Socket: Using {} threads and {} sockets per thread", nThreads_, perThread);
  }

  const char* name() const override { return "Socket"; }
  int devices() const override { return static_cast<int>(ifs_.size()); }

  NetProperties getProperties(int dev) const override {
    checkDev(dev);
    NetProperties p;
    p.name = ifs_[dev].name;
    p.speedMbps = netif::speedMbps(p.name);
    char real[4096];
    std::string dpath = "/sys/class/net/" + p.name + "/device";
    if (::realpath(dpath.c_str(), real)) p.pciPath = real;
    return p;
  }

  // ncclConfig_t's trafficClass: the IP traffic class (TOS byte / IPv6 traffic class) of every NET socket; and the
  // socket's pacing cap (TOPOCOLL_SOCKET_PACING: by default 1.25x the interface's speed under BBR, docs/transport.md,
  // "Pacing").
  void markTraffic(const Socket& sock, int dev) const {
    std::string congestion;
    if (pacingMbps_ < 0) {
      char name[16] = {};
      socklen_t len = sizeof name;
      if (::getsockopt(sock.fd(), IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0)
        congestion.assign(name, strnlen(name, len));
    }
    const uint64_t cap = socketPacingBytesPerSec(pacingMbps_, congestion, statedMbps_[dev]);
    if (cap > 0) {
      const unsigned long bytesPerSec = cap;
      if (::setsockopt(sock.fd(), SOL_SOCKET, SO_MAX_PACING_RATE, &bytesPerSec, sizeof bytesPerSec) != 0)
        TC_INFO(log::kNet, "NET/Socket : pacing at {} Mbit/s: setsockopt: {}", cap / 125000, std::strerror(errno));
      else if (!pacingLogged_.test_and_set())
        TC_INFO(log::kInit | log::kNet, "NET/Socket : pacing each socket at {} Mbit/s ({})", cap / 125000,
                pacingMbps_ > 0
                    ? std::string("TOPOCOLL_SOCKET_PACING")
                    : fmt::format("1.25 x {}'s {} Mbit/s, {}", ifs_[dev].name, statedMbps_[dev], congestion));
    }
    if (trafficClass_ < 0) return;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::getsockname(sock.fd(), reinterpret_cast<sockaddr*>(&local), &len) != 0) return;
    const int tc = trafficClass_ & 0xff;
    const int rc = local.ss_family == AF_INET6 ? ::setsockopt(sock.fd(), IPPROTO_IPV6, IPV6_TCLASS, &tc, sizeof tc)
                                      : ::setsockopt(sock.fd(), IPPROTO_IP, IP_TOS, &tc, sizeof tc);
    if (rc != 0)
      TC_INFO(log::kNet, "NET/Socket : traffic class {}: setsockopt: {}", tc, std::strerror(errno));
  }

  std::unique_ptr<NetComm> listen(int dev, NetHandle* handle) override {
    checkDev(dev);
    auto l = std::make_unique<ListenComm>();
    l->dev = dev;
    SocketAddress a = SocketAddress::from(ifs_[dev].addr, ifs_[dev].len);
    a.setPort(0);
    SocketAddress bound;
    try {
      l->sock = Socket::listen(a, &bound, {.backlog = 128, .reuseAddr = false});
    } catch (const SocketError& e) {
      if (std::strcmp(e.call(), "socket") == 0) fail(StatusCode::kSystemError, "NET/Socket : {}", e.what());
      fail(StatusCode::kSystemError, "NET/Socket : listen on {}: {}", ifs_[dev].name, std::strerror(e.error()));
    }
    l->key = AuthKey::random();
    l->nSocks = nSocks_;
    l->nThreads = nThreads_;
    Handle h;
    std::memcpy(h.key, l->key.bytes.data(), sizeof(h.key));
    h.nSocks = static_cast<uint8_t>(nSocks_);
    h.nThreads = static_cast<uint8_t>(nThreads_);
    h.addr = bound.toWire();
    *handle = NetHandle{};
    std::memcpy(handle->bytes, &h, sizeof(h));
    return l;
  }

  std::unique_ptr<NetComm> connect(int dev, const NetHandle& handle, std::unique_ptr<NetComm>* state) override {
    if (!*state) {
      auto s = std::make_unique<ConnectState>();
      std::memcpy(&s->handle, handle.bytes, sizeof(Handle));
      SocketAddress a = peerOf(s->handle);
      for (int i = 0; i <= s->handle.nSocks; ++i) {
        int err = 0;
        Socket sock;
        try {
          sock = Socket::connectStart(a, &err);
        } catch (const SocketError& e) {
          fail(StatusCode::kSystemError, "NET/Socket : {}", e.what());
        }
        if (err != 0 && err != EINPROGRESS)
          fail(StatusCode::kRemoteError, "NET/Socket : connect to {}: {}", addrString(a), std::strerror(err));
        markTraffic(sock, dev);
        s->socks.push_back(std::move(sock));
        s->auth.emplace_back(keyOf(s->handle), Handshake::Role::kConnector);
        s->sent.push_back(0);
      }
      *state = std::move(s);
    }
    auto& s = static_cast<ConnectState&>(**state);
    SocketAddress peer = peerOf(s.handle);
    bool all = true;
    for (size_t i = 0; i < s.socks.size(); ++i) {
      Hello hello{i == 0 ? kCtrlIndex : static_cast<uint32_t>(i - 1)};
      if (s.sent[i] == 0) {
        IoStatus st = s.socks[i].connectProgress();
        if (st.wouldBlock()) {
          all = false;
          continue;
        }
        if (st.broken()) fail(StatusCode::kRemoteError, "NET/Socket : connect to {}: {}", addrString(peer), st.why());
        st = s.auth[i].step(s.socks[i]);
        if (st.broken())
          fail(StatusCode::kRemoteError, "NET/Socket : connect to {}: authentication failed: {}", addrString(peer),
               s.auth[i].why());
        if (!st.done()) {
          all = false;
          continue;
        }
      }
      if (!ioStep(true, s.socks[i], reinterpret_cast<char*>(&hello), sizeof(hello), &s.sent[i],
                  addrString(peer).c_str()))
        all = false;
    }
    if (!all) return nullptr;
    auto c = std::make_unique<SocketComm>();
    c->peer = addrString(peer);
    c->ctrl = std::move(s.socks[0]);
    for (size_t i = 1; i < s.socks.size(); ++i) c->socks.push_back(std::move(s.socks[i]));
    c->nThreads = s.handle.nThreads;
    state->reset();
    startHelpers(*c);
    return c;
  }

  std::unique_ptr<NetComm> accept(NetComm& listenComm) override {
    auto& l = static_cast<ListenComm&>(listenComm);
    while (true) {
      Socket s;
      try {
        s = l.sock.acceptNow();
      } catch (const SocketError&) {  // out of descriptors: the connections already in get their turn
        break;
      }
      if (!s.valid()) break;
      markTraffic(s, l.dev);
      l.incoming.push_back({std::move(s), Handshake(l.key, Handshake::Role::kAcceptor), Hello{}, 0});
    }
    for (size_t i = 0; i < l.incoming.size();) {
      auto& in = l.incoming[i];
      if (!in.auth.done()) {
        IoStatus st = in.auth.step(in.sock);
        if (st.broken()) {
          TC_WARN("NET/Socket : dropped a connection from {}: authentication failed: {}", in.sock.peerName(),
                  in.auth.why());
          l.incoming.erase(l.incoming.begin() + static_cast<long>(i));
          continue;
        }
        if (!st.done()) {
          ++i;
          continue;
        }
      }
      bool complete;
      try {
        complete = ioStep(false, in.sock, reinterpret_cast<char*>(&in.hello), sizeof(Hello), &in.got, "a peer");
      } catch (const Error& e) {
        l.incoming.erase(l.incoming.begin() + static_cast<long>(i));  // gone before saying hello
        continue;
      }
      if (!complete) {
        ++i;
        continue;
      }
      bool ok = in.hello.index == kCtrlIndex || in.hello.index < static_cast<uint32_t>(l.nSocks);
      if (!ok) {
        TC_WARN("NET/Socket : dropped a connection from {}: socket index {} of {}", in.sock.peerName(),
                in.hello.index, l.nSocks);
      } else if (in.hello.index == kCtrlIndex) {
        l.ctrl = std::move(in.sock);
      } else {
        if (l.socks.size() < static_cast<size_t>(l.nSocks)) l.socks.resize(l.nSocks);
        l.socks[in.hello.index] = std::move(in.sock);
      }
      l.incoming.erase(l.incoming.begin() + static_cast<long>(i));
    }
    if (!l.ctrl.valid()) return nullptr;
    for (int i = 0; i < l.nSocks; ++i)
      if (static_cast<size_t>(i) >= l.socks.size() || !l.socks[i].valid()) return nullptr;
    auto c = std::make_unique<SocketComm>();
    c->peer = addrString(l.ctrl.peerAddress());
    c->ctrl = std::move(l.ctrl);
    c->socks = std::move(l.socks);
    c->nThreads = l.nThreads;
    startHelpers(*c);
    return c;
  }

  NetRequest* isend(NetComm& comm, const void* data, size_t size, int tag, void* mhandle) override {
    return post(static_cast<SocketComm&>(comm), true, const_cast<void*>(data), size);
  }
  NetRequest* irecv(NetComm& comm, void* data, size_t size, int tag, void* mhandle) override {
    return post(static_cast<SocketComm&>(comm), false, data, size);
  }

  bool test(NetRequest* request, size_t* size) override {
    auto& r = static_cast<Request&>(*request);
    auto& c = *r.comm;
    if (r.state == 1) {
      if (r.send) {
        size_t inl = r.size <= kInline ? r.size : 0;
        size_t msg = 4 + inl;
        if (r.ctrlOff == 0 && inl) std::memcpy(&r.ctrl[1], r.data, inl);
        r.ctrl[0] = static_cast<uint32_t>(r.size);
        // MSG_MORE where bytes follow at once on this socket: the payload, or the next send already posted (the
        // NET transport posts a step's 64-byte header and then its chunk, and tests them in turn), so that a small
        // message shares a segment with what follows instead of taking a packet of its own.
        bool payloadFollows = !inl && r.size > 0 && c.socks.empty();
        bool sendFollows = inl && r.seq != c.sends;
        if (!ioStep(true, c.ctrl, reinterpret_cast<char*>(r.ctrl), msg, &r.ctrlOff, c.peer.c_str(),
                    payloadFollows || sendFollows))
          return false;
      } else {
        if (!ioStep(false, c.ctrl, reinterpret_cast<char*>(r.ctrl), 4, &r.ctrlOff, c.peer.c_str())) return false;
        size_t sender = r.ctrl[0];
        if (sender > r.size)
          fail(StatusCode::kInvalidUsage, "NET/Socket : peer {} message truncated : receiving {} bytes instead of {}",
               c.peer, sender, r.size);
        r.size = sender;
        size_t inl = r.size <= kInline ? r.size : 0;
        if (inl && !ioStep(false, c.ctrl, reinterpret_cast<char*>(r.ctrl), 4 + inl, &r.ctrlOff, c.peer.c_str()))
          return false;
        if (inl) std::memcpy(r.data, &r.ctrl[1], inl);
      }
      r.state = 2;
      r.offset = r.size <= kInline ? r.size : 0;
      if (!c.socks.empty() && r.offset < r.size) {
        // Split over the data sockets in tasks of at least 64 KiB, round robin (the peer splits the same way).
        size_t task = std::max(kMinTask, (r.size - r.offset + c.socks.size() - 1) / c.socks.size());
        for (size_t off = r.offset; off < r.size; off += task) {
          auto t = std::make_unique<Task>();
          t->send = r.send;
          t->data = r.data + off;
          t->size = std::min(task, r.size - off);
          t->sock = &c.socks[c.nextSock];
          int helper = c.nextSock % c.nThreads;
          c.nextSock = (c.nextSock + 1) % static_cast<int>(c.socks.size());
          c.helpers[helper]->add(t.get());
          r.tasks.push_back(std::move(t));
        }
      }
    }
    if (!r.tasks.empty()) {
      for (auto& t : r.tasks) {
        if (!t->done.load(std::memory_order_acquire)) return false;
        if (!t->error.empty()) fail(StatusCode::kRemoteError, "{}", t->error);
      }
      uint64_t v;
      while (::read(c.done.get(), &v, sizeof(v)) > 0) {
      }
      r.tasks.clear();
    } else if (!ioStep(r.send, c.ctrl, r.data, r.size, &r.offset, c.peer.c_str())) {
      return false;
    }
    if (size) *size = r.size;
    r.state = 0;
    return true;
  }

  void pollFds(NetComm& comm, std::vector<pollfd>& fds) override {
    auto& c = static_cast<SocketComm&>(comm);
    short ev = 0;
    for (auto& r : c.requests) {
      if (r.state == 0) continue;
      if (!r.tasks.empty()) continue;
      ev |= r.send ? POLLOUT : POLLIN;
    }
    if (ev) fds.push_back({c.ctrl.fd(), ev, 0});
    if (c.done.valid()) fds.push_back({c.done.get(), POLLIN, 0});
  }

 private:
  void checkDev(int dev) const {
    if (dev < 0 || dev >= devices())
      fail(StatusCode::kInvalidArgument, "NET/Socket : device {} of {}", dev, devices());
  }

  void startHelpers(SocketComm& c) {
    if (c.socks.empty()) return;
    c.done = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    int perThread = static_cast<int>(c.socks.size()) / std::max(1, c.nThreads);
    for (int t = 0; t < c.nThreads; ++t) {
      std::vector<int> fds;
      for (int s = 0; s < perThread; ++s) fds.push_back(c.socks[t * perThread + s].fd());
      c.helpers.push_back(std::make_unique<Helper>(&c, fds));
    }
  }

  NetRequest* post(SocketComm& c, bool send, void* data, size_t size) {
    if (size > UINT32_MAX) fail(StatusCode::kInvalidArgument, "NET/Socket : message of {} bytes", size);
    for (auto& r : c.requests) {
      if (r.state != 0) continue;
      r.state = 1;
      r.send = send;
      r.data = static_cast<char*>(data);
      r.size = size;
      r.ctrlOff = r.offset = 0;
      r.comm = &c;
      if (send) r.seq = ++c.sends;
      return &r;
    }
    return nullptr;
  }

  std::vector<netif::Interface> ifs_;
  int nThreads_ = 0, nSocks_ = 0;
  int trafficClass_ = -1;
  int pacingMbps_ = 0;             // TOPOCOLL_SOCKET_PACING
  std::vector<int> statedMbps_;    // each interface's speed as the kernel states it, 0 where it states none
  mutable std::atomic_flag pacingLogged_;
};

}  // namespace

// BBR estimates the bottleneck's rate from how fast acknowledgements return. Ours cross the link as pure ACKs
// behind the peer's data (a NET connection is one TCP flow a direction) and come back bunched, so BBR can read far
// more than the link and keep twice its share in flight. A cap at BBR's highest pacing gain over the link's rate
// keeps its probing and bounds the misreading; no NIC sends faster than its speed, so the cap costs nothing there.
uint64_t socketPacingBytesPerSec(int knob, std::string_view congestion, int statedMbps) {
  constexpr uint64_t kBytesPerMbit = 125000;
  if (knob > 0) return static_cast<uint64_t>(knob) * kBytesPerMbit;
  if (knob < 0 && congestion == "bbr" && statedMbps > 0)
    return static_cast<uint64_t>(statedMbps) * kBytesPerMbit * 5 / 4;
  return 0;
}

std::unique_ptr<Net> makeSocketNet(const Config& cfg) { return std::make_unique<SocketNet>(cfg); }

}  // namespace topocoll::transport
