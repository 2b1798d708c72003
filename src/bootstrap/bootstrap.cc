// TCP bootstrap, the ranks' side: registration with the root, ring, ring allgather and tagged point-to-point
// messages (NCCL's bootstrap.cc design, our code). Every connection carries proof that its sender holds the job's
// secret (auth.h): the exchange with the root (which always answers), and a seal after each message between ranks
// (sent without waiting for the receiver, which reads its connections only while it waits in a bootstrap call).
// Messages start with a header carrying the job's magic and the sender's rank; anything else is dropped and logged,
// never trusted. Incoming connections are read
// concurrently with whatever the rank waits for, so a stranger cannot stall it, and a failure anywhere in the job
// (a rank that died, or aborted) reaches every rank as a message naming the rank and the phase.
#include "topocoll/bootstrap/bootstrap.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "root.h"
#include "stream.h"
#include "wire.h"
#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll::bootstrap {

namespace {

// How long a rank that lost a neighbour waits for the message that says why (the neighbour may have left because
// the job failed elsewhere) before it concludes that the neighbour died and tells the others.
constexpr auto kGrace = std::chrono::milliseconds(1000);
// Per incoming connection: its message must arrive within this (the rank keeps waiting for others meanwhile).
constexpr auto kIncomingWait = std::chrono::seconds(10);
// Per peer, when telling every rank that the job fails.
constexpr auto kTellDeadline = std::chrono::milliseconds(500);

uint64_t idMagic(const UniqueId& id) {
  uint64_t m;
  std::memcpy(&m, id.bytes.data(), sizeof(m));
  return m;
}

// The id's layout: [0, 8) magic, [8, 28) the root's WireAddr, [32, 64) the job's secret.
constexpr size_t kKeyOffset = 32;
static_assert(sizeof(uint64_t) + sizeof(WireAddr) <= kKeyOffset && kKeyOffset + sizeof(AuthKey) <= sizeof(UniqueId));

UniqueId makeId(uint64_t magic, const WireAddr& w, const AuthKey& key) {
  UniqueId id;
  std::memcpy(id.bytes.data(), &magic, sizeof(magic));
  std::memcpy(id.bytes.data() + sizeof(magic), &w, sizeof(w));
  std::memcpy(id.bytes.data() + kKeyOffset, key.bytes.data(), key.bytes.size());
  return id;
}

// What a seal binds a message to: its receiver.
std::string sealContext(int rank) { return "bootstrap message to rank " + std::to_string(rank); }

}  // namespace

UniqueId withKey(const UniqueId& id, const AuthKey& key) {
  UniqueId out = id;
  std::memcpy(out.bytes.data() + kKeyOffset, key.bytes.data(), key.bytes.size());
  return out;
}

AuthKey keyOf(const UniqueId& id) {
  AuthKey k;
  std::memcpy(k.bytes.data(), id.bytes.data() + kKeyOffset, k.bytes.size());
  return k;
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
// Root handle and ids

RootHandle::RootHandle() = default;
RootHandle::RootHandle(RootHandle&&) noexcept = default;
RootHandle& RootHandle::operator=(RootHandle&&) noexcept = default;
RootHandle::~RootHandle() = default;
bool RootHandle::finished() const { return !root || root->ended(); }

void RootHandle::abort(const std::string& reason, std::chrono::milliseconds linger) {
  if (root) root->abort(reason, Clock::now() + linger);
}

UniqueId uniqueIdFor(const std::string& hostPort, uint64_t magic, const AuthKey& key) {
  return makeId(magic, SocketAddress::parse(hostPort).toWire(), key);
}

UniqueId createUniqueId(RootHandle* holder, const std::string& hostPort, uint64_t magic, int nRanks,
                        const AuthKey* key) {
  SocketAddress bind = hostPort.empty() ? defaultAddress() : SocketAddress::parse(hostPort);
  const AuthKey k = key ? *key : AuthKey::random();
  auto root = std::make_unique<Root>(bind, magic, nRanks, k);
  UniqueId id = makeId(root->magic(), root->address().toWire(), k);
  if (holder) holder->root = std::move(root);
  return id;
}

// ---------------------------------------------------------------------------------------------------------------
// Ranks

struct TcpBootstrap::Impl {
  Options opts;
  int rank = 0, nRanks = 0;
  uint64_t magic = 0;
  AuthKey key;
  Socket listener;
  SocketAddress listenAddr;
  // The connection to the root, kept until this rank's bootstrap is complete: the root tells it about failures
  // (and it tells the root) while the ranks cannot reach each other yet.
  Socket root;
  SocketAddress rootAddr;
  MessageParser rootParser;
  std::optional<WireAddr> nextAddr;
  Socket next, prev;
  std::vector<WireAddr> peers;
  struct Incoming {
    Socket sock;
    MessageParser parser;
    Seal seal{};  // follows the message (sealed())
    size_t sealGot = 0;
    Clock::time_point deadline;
  };
  // The nonces of the seals this rank accepted: a message is acted on once.
  std::set<std::array<uint8_t, sizeof(Seal::nonce)>> seenNonces;
  std::vector<Incoming> incoming;
  struct Message {
    int rank, tag;
    std::vector<uint8_t> data;
  };
  std::deque<Message> unexpected;
  std::mutex mu;  // one receiving operation at a time

  std::mutex failMu;                              // guards what follows (abort() and send() may come from any thread)
  std::string phase = "registration with the root";
  std::optional<Error> failed;  // the job's failure once known: every later call throws it
  std::string elsewhere;        // another rank's (or the root's) word of the failure, as it said it
  bool told = false;            // this rank told the others about a failure
  bool relayed = false;         // this rank passed a failure it heard of on to its neighbours (relay)

  Clock::time_point deadline() const { return Clock::now() + opts.timeout; }

  void throwIfFailed() {
    std::lock_guard<std::mutex> lock(failMu);
    if (failed) throw *failed;
  }
  void markFailed(StatusCode code, const std::string& text) {
    std::lock_guard<std::mutex> lock(failMu);
    if (!failed) failed.emplace(code, text);
  }
  [[noreturn]] void failWith(StatusCode code, const std::string& text) {
    markFailed(code, text);
    throwIfFailed();
    std::abort();  // unreachable
  }

  // The job failed elsewhere: kept as said (failedElsewhere()) unless this rank failed first.
  void heardOf(const std::string& text) {
    std::lock_guard<std::mutex> lock(failMu);
    if (!failed && elsewhere.empty()) elsewhere = text;
  }

  Interrupt interrupt() {
    return abortable(opts.abortFlag, [this] {
      std::vector<pollfd> none;
      service(none, 0);
    });
  }

  // Polls `own` (the caller's sockets) together with the listener, the incoming connections and the root for up to
  // `ms`, handles what arrived on the latter, and throws when the job failed.
  // What arrived so far, without waiting (a failure of the job is kept: the next receive, or failedElsewhere(),
  // says so).
  void serveArrived() {
    try {
      std::vector<pollfd> none;
      service(none, 0);
    } catch (const Error&) {
    }
  }

  void service(std::vector<pollfd>& own, int ms) {
    pump(own, ms);
    throwIfFailed();
  }

  // service() without the throw: what arrived is handled (a failure told is recorded), for the survivors' messages.
  void pump(std::vector<pollfd>& own, int ms) {
    std::vector<pollfd> fds = own;
    const size_t base = fds.size();
    fds.push_back({listener.fd(), POLLIN, 0});
    for (auto& c : incoming) fds.push_back({c.sock.fd(), POLLIN, 0});
    fds.push_back({root.valid() ? root.fd() : -1, POLLIN, 0});
    int r = ::poll(fds.data(), fds.size(), ms);
    if (r < 0 && errno != EINTR) fail(StatusCode::kSystemError, "rank {}: poll: {}", rank, std::strerror(errno));
    for (size_t i = 0; i < base; ++i) own[i].revents = fds[i].revents;
    const size_t nIncoming = incoming.size();
    for (size_t i = 0; i < nIncoming; ++i)
      if (fds[base + 1 + i].revents) onIncoming(incoming[i]);
    if (fds.back().revents) onRoot();
    auto now = Clock::now();
    for (auto& c : incoming)
      if (c.sock.valid() && now >= c.deadline) dropIncoming(c, "no complete message in time");
    std::erase_if(incoming, [](const Incoming& c) { return !c.sock.valid(); });
    if (fds[base].revents) acceptAll();
  }

  void acceptAll() {
    while (true) {
      Socket c;
      try {
        c = listener.acceptNow();
      } catch (const Error& e) {
        if (incoming.empty()) return;
        dropIncoming(incoming.front(), std::string("out of descriptors: ") + e.what());
        incoming.erase(incoming.begin());
        continue;
      }
      if (!c.valid()) return;
      auto wait = std::min<Clock::duration>(opts.timeout, kIncomingWait);
      incoming.push_back(Incoming{std::move(c), MessageParser({magic, nRanks, opts.maxMessageBytes}), Seal{}, 0,
                                  Clock::now() + wait});
    }
  }

  // The seal that every message to this rank carries after its body (auth.h): read, checked, its nonce remembered.
  // False while it has not arrived (or when the connection was dropped for it).
  bool sealed(Incoming& c) {
    IoStatus st = c.sock.recvSome(&c.seal, sizeof(Seal), &c.sealGot);
    if (st.wouldBlock()) return false;
    if (st.broken()) {
      dropIncoming(c, "closed before the message's seal");
      return false;
    }
    const Header& h = c.parser.header();
    const auto& body = c.parser.body();
    if (!sealMatches(key, sealContext(rank), {reinterpret_cast<const char*>(&h), sizeof(h)},
                     {reinterpret_cast<const char*>(body.data()), body.size()}, c.seal)) {
      dropIncoming(c, "authentication failed: its seal is not the job's (it does not hold the job's secret)");
      return false;
    }
    std::array<uint8_t, sizeof(Seal::nonce)> nonce;
    std::memcpy(nonce.data(), c.seal.nonce, nonce.size());
    if (!seenNonces.insert(nonce).second) {
      dropIncoming(c, "authentication failed: a message this rank already received, played again");
      return false;
    }
    return true;
  }

  void dropIncoming(Incoming& c, const std::string& why) {
    TC_WARN("Bootstrap : rank {}: dropped a connection from {}: {}", rank, c.sock.peerName(), why);
    c.sock = Socket();
  }

  void onIncoming(Incoming& c) {
    switch (readMessage(c.sock, c.parser)) {
      case ReadStatus::kWaiting:
        return;
      case ReadStatus::kClosed:
        dropIncoming(c, c.parser.headerComplete() ? "closed in the middle of a message" : "closed before a message");
        return;
      case ReadStatus::kRejected:
        dropIncoming(c, c.parser.why());
        return;
      case ReadStatus::kMessage:
        break;
    }
    if (!sealed(c)) return;
    const Header& h = c.parser.header();
    if (h.tag == kTagAbort) {
      auto b = c.parser.takeBody();
      c.sock = Socket();
      heardOf(std::string(b.begin(), b.end()));
      markFailed(StatusCode::kRemoteError, fmt::format("rank {}: {}", rank, std::string(b.begin(), b.end())));
      return;  // service() throws it
    }
    if (h.tag == kTagRing) {
      if (h.rank == (rank - 1 + nRanks) % nRanks && !prev.valid()) prev = std::move(c.sock);
      else dropIncoming(c, fmt::format("unexpected ring connection from rank {}", h.rank));
      return;
    }
    if (h.tag < 0 && h.tag != kTagBcast) {
      dropIncoming(c, fmt::format("unexpected message tag {}", h.tag));
      return;
    }
    unexpected.push_back(Message{h.rank, h.tag, c.parser.takeBody()});
    c.sock = Socket();
  }

  void onRoot() {
    auto st = readMessage(root, rootParser);
    if (st == ReadStatus::kWaiting) return;
    if (st == ReadStatus::kClosed) {
      root = Socket();
      failWith(StatusCode::kRemoteError,
               fmt::format("rank {}: the root at {} closed its connection during {} (the process hosting it, rank 0 "
                           "under a launcher, died)",
                           rank, rootAddr.toString(), currentPhase()));
    }
    if (st == ReadStatus::kRejected) {
      root = Socket();
      failWith(StatusCode::kRemoteError,
               fmt::format("rank {}: the root at {} sent a malformed message: {}", rank, rootAddr.toString(),
                           rootParser.why()));
    }
    const Header h = rootParser.header();
    auto b = rootParser.takeBody();
    rootParser.reset();
    if (h.tag == kTagRegister && b.size() == sizeof(WireAddr) && !nextAddr) {
      WireAddr w;
      std::memcpy(&w, b.data(), sizeof(w));
      nextAddr = w;
    } else if (h.tag == kTagError && !b.empty()) {
      root = Socket();
      auto code = static_cast<StatusCode>(b[0]);
      if (code != StatusCode::kTimeout && code != StatusCode::kInvalidUsage) code = StatusCode::kRemoteError;
      heardOf(std::string(b.begin() + 1, b.end()));
      failWith(code, fmt::format("rank {}: {}", rank, std::string(b.begin() + 1, b.end())));
    } else if (h.tag == kTagRefused) {
      root = Socket();
      failWith(StatusCode::kInvalidUsage,
               fmt::format("rank {}: connected to a different job's root at {} (the jobs' ids differ): two jobs use "
                           "one root address; give each its own NCCL_COMM_ID or MASTER_PORT",
                           rank, rootAddr.toString()));
    } else {
      failWith(StatusCode::kRemoteError,
               fmt::format("rank {}: unexpected message (tag {}) from the root at {}", rank, h.tag,
                           rootAddr.toString()));
    }
  }

  // Until `done()` or the deadline (naming `what`), serving incoming connections and the root meanwhile.
  template <typename Done>
  void waitUntil(Done done, Clock::time_point until, const std::string& what) {
    std::vector<pollfd> none;
    while (!done()) {
      checkWait(until, what);
      service(none, pollSlice(until));
    }
  }

  void checkWait(Clock::time_point until, const std::string& what) {
    if (opts.abortFlag && opts.abortFlag->load()) fail(StatusCode::kAborted, "rank {}: bootstrap aborted: {}", rank, what);
    if (Clock::now() >= until) fail(StatusCode::kTimeout, "rank {}: timeout: {}", rank, what);
  }

  std::string currentPhase() {
    std::lock_guard<std::mutex> lock(failMu);
    return phase;
  }

  // Tells the root (while this rank is connected to it) or every other rank that the job fails.
  void tellOthers(const std::string& text, int except) {
    {
      std::lock_guard<std::mutex> lock(failMu);
      if (told) return;
      told = true;
    }
    // Through the root, which tells everyone; and to the ring neighbours directly too: the root may live in a
    // process that is about to exit (rank 0's, failing as this rank did) before it passed the word on, and the
    // neighbours are the ones that would otherwise blame this rank when it leaves.
    const bool viaRoot = root.valid();
    if (viaRoot) trySend(root, Header{magic, rank, kTagAbort, text.size()}, text.data(), Clock::now() + kTellDeadline);
    tellDirectly(text, viaRoot, except);
  }

  // Sends the job's failure to the ring neighbours, then (all: when the root cannot tell everyone) to every other
  // rank but `except`, each connection its own, bounded by kTellDeadline.
  void tellDirectly(const std::string& text, bool neighboursOnly, int except) {
    if (static_cast<int>(peers.size()) != nRanks) return;
    Header h{magic, rank, kTagAbort, text.size()};
    std::vector<int> order = {(rank + 1) % nRanks, (rank - 1 + nRanks) % nRanks};
    for (int r = 0; r < nRanks && !neighboursOnly; ++r) order.push_back(r);
    std::vector<uint8_t> done(nRanks, 0);
    done[rank] = 1;
    if (except >= 0) done[except] = 1;
    for (int r : order) {
      if (done[r]) continue;
      done[r] = 1;
      SocketAddress a;
      if (!SocketAddress::fromWire(peers[r], &a)) continue;
      try {
        const auto until = Clock::now() + kTellDeadline;
        Socket s = Socket::connect(a, until, Interrupt{}, "telling a rank that the job fails", /*retryRefused=*/false);
        sendSealed(s, r, h, text.data(), until, Interrupt{}, "telling a rank that the job fails");
      } catch (const Error&) {  // that rank is gone too, or leaving
      }
    }
  }

  // A neighbour's connection broke: either the job failed elsewhere (its message is on the way) or `peer` died.
  [[noreturn]] void lost(int peer, const std::string& how) {
    auto until = Clock::now() + kGrace;
    std::vector<pollfd> none;
    while (Clock::now() < until) service(none, pollSlice(until));
    std::string text = fmt::format("rank {} died during {} (rank {} {})", peer, currentPhase(), rank, how);
    tellOthers(text, peer);
    failWith(StatusCode::kRemoteError, fmt::format("rank {}: {}", rank, text));
  }

  // A message to rank `to`, its seal after it (auth.h). Throws as Socket::sendAll does.
  void sendSealed(Socket& s, int to, const Header& h, const void* body, Clock::time_point until, const Interrupt& intr,
                  const std::string& what) {
    const Seal seal = sealMessage(key, sealContext(to), {reinterpret_cast<const char*>(&h), sizeof(h)},
                                  {static_cast<const char*>(body), body ? h.size : 0});
    s.sendAll(&h, sizeof(h), until, intr, what);
    if (h.size) s.sendAll(body, h.size, until, intr, what);
    s.sendAll(&seal, sizeof(seal), until, intr, what);
  }

  void ringAllGather(void* data, size_t size);
};

void TcpBootstrap::Impl::ringAllGather(void* data, size_t size) {
  auto* base = static_cast<uint8_t*>(data);
  const auto until = deadline();
  const int prevRank = (rank - 1 + nRanks) % nRanks, nextRank = (rank + 1) % nRanks;
  for (int i = 0; i < nRanks - 1; ++i) {
    int sendSlice = (rank - i + nRanks) % nRanks;
    int recvSlice = (rank - i - 1 + nRanks) % nRanks;
    // Send and receive together so that large slices cannot deadlock on full socket buffers.
    const uint8_t* sp = base + static_cast<size_t>(sendSlice) * size;
    uint8_t* rp = base + static_cast<size_t>(recvSlice) * size;
    size_t sent = 0, got = 0;
    std::string what = fmt::format("{}, allGather step {} (waiting for rank {})", currentPhase(), i, prevRank);
    while (sent < size || got < size) {
      checkWait(until, what);
      std::vector<pollfd> own = {{next.fd(), static_cast<short>(sent < size ? POLLOUT : 0), 0},
                                 {prev.fd(), static_cast<short>(got < size ? POLLIN : 0), 0}};
      service(own, pollSlice(until));
      if (sent < size && (own[0].revents & (POLLOUT | POLLERR | POLLHUP)) && next.sendSome(sp, size, &sent).broken())
        lost(nextRank, "lost its connection to it");
      if (got < size && (own[1].revents & (POLLIN | POLLERR | POLLHUP)) && prev.recvSome(rp, size, &got).broken())
        lost(prevRank, "lost its connection to it");
    }
  }
}

std::unique_ptr<TcpBootstrap> TcpBootstrap::connect(const UniqueId& id, int rank, int nRanks, const Options& opts) {
  if (nRanks <= 0 || nRanks > kMaxRanks || rank < 0 || rank >= nRanks)
    fail(StatusCode::kInvalidArgument, "bootstrap: rank {} of {} is out of range", rank, nRanks);
  std::unique_ptr<TcpBootstrap> bs(new TcpBootstrap());
  bs->rank_ = rank;
  bs->nRanks_ = nRanks;
  bs->impl_ = std::make_unique<Impl>();
  Impl& I = *bs->impl_;
  I.opts = opts;
  I.rank = rank;
  I.nRanks = nRanks;
  I.magic = idMagic(id);
  I.key = keyOf(id);
  WireAddr rootW;
  std::memcpy(&rootW, id.bytes.data() + sizeof(I.magic), sizeof(rootW));
  if (!SocketAddress::fromWire(rootW, &I.rootAddr))
    fail(StatusCode::kInvalidArgument, "bootstrap: the unique id holds no root address (address family {})",
         rootW.family);
  SocketAddress mine = I.rootAddr.isLoopback() && opts.socketIfname.empty()
                           ? I.rootAddr
                           : chooseAddress(opts.socketIfname, opts.socketFamily);
  mine.setPort(0);
  I.listener = Socket::listen(mine, &I.listenAddr);
  TC_INFO(log::kInit | log::kBootstrap, "Bootstrap : Using {} (root {})", I.listenAddr.toString(),
          I.rootAddr.toString());

  // Registration: the root answers with the next rank's address once every rank has registered.
  const auto until = I.deadline();
  std::string what = fmt::format("rank {} registering with the root at {}", rank, I.rootAddr.toString());
  I.root = Socket::connect(I.rootAddr, until, abortable(opts.abortFlag), what);
  try {
    authenticate(I.root, I.key, until, abortable(opts.abortFlag), what);
  } catch (const AuthError& e) {
    // Another job's root (or this job's, given another secret): the same advice as for a foreign magic.
    fail(StatusCode::kInvalidUsage,
         "rank {}: connected to a different job's root at {} (the jobs' ids or secrets differ): two jobs use one root "
         "address; give each its own NCCL_COMM_ID or MASTER_PORT, and every rank of a job the same TOPOCOLL_JOB_SECRET "
         "({})",
         rank, I.rootAddr.toString(), e.what());
  }
  I.rootParser = MessageParser({I.magic, 0, kMaxControlBytes});
  Registration reg{I.listenAddr.toWire(), nRanks, static_cast<int64_t>(opts.timeout.count())};
  Header h{I.magic, rank, kTagRegister, sizeof(reg)};
  I.root.sendAll(&h, sizeof(h), until, I.interrupt(), what);
  I.root.sendAll(&reg, sizeof(reg), until, I.interrupt(), what);
  if (opts.testDieAfter == "register") std::_Exit(3);
  I.waitUntil([&] { return I.nextAddr.has_value(); }, until,
              fmt::format("rank {} waiting for all {} ranks to register (some rank has not started)", rank, nRanks));

  // The ring: connect to next, accept prev (queueing anything else that arrives first).
  bs->setPhase("bootstrap ring setup");
  const int next = (rank + 1) % nRanks, prev = (rank - 1 + nRanks) % nRanks;
  what = fmt::format("rank {} connecting to rank {}", rank, next);
  SocketAddress nextAddr;
  if (!SocketAddress::fromWire(*I.nextAddr, &nextAddr))
    fail(StatusCode::kRemoteError, "rank {}: the root sent no address for rank {}", rank, next);
  try {
    I.next = Socket::connect(nextAddr, until, I.interrupt(), what, /*retryRefused=*/false);  // it listens already
    I.sendSealed(I.next, next, Header{I.magic, rank, kTagRing, 0}, nullptr, until, I.interrupt(), what);
  } catch (const Error& e) {
    I.throwIfFailed();
    if (e.code() != StatusCode::kRemoteError) throw;
    I.lost(next, "could not connect to it");
  }
  I.waitUntil([&] { return I.prev.valid(); }, until,
              fmt::format("rank {} waiting for rank {} to join the ring", rank, prev));
  if (opts.testDieAfter == "ring") std::_Exit(3);

  // Every rank's address, so that any rank can reach any other; then the root is no longer needed.
  bs->setPhase("bootstrap address allgather");
  I.peers.resize(nRanks);
  I.peers[rank] = I.listenAddr.toWire();
  bs->allGather(I.peers.data(), sizeof(WireAddr));
  trySend(I.root, Header{I.magic, rank, kTagReady, 0}, nullptr, Clock::now() + std::chrono::seconds(2));
  I.root = Socket();
  bs->setPhase("communicator init");
  return bs;
}

TcpBootstrap::~TcpBootstrap() = default;

void TcpBootstrap::setPhase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(impl_->failMu);
  impl_->phase = phase;
}

void TcpBootstrap::abort(const std::string& reason) {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lock(I.failMu);
    if (I.failed || I.told) return;
  }
  std::string text = fmt::format("rank {} failed during {}: {}", rank_, I.currentPhase(), reason);
  I.tellOthers(text, -1);
  std::lock_guard<std::mutex> lock(I.failMu);
  if (!I.failed) I.failed.emplace(StatusCode::kAborted, text);
}

void TcpBootstrap::relay(const std::string& text) {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lock(I.failMu);
    if (I.told || I.relayed) return;
    I.relayed = true;
  }
  I.tellDirectly(text, true, -1);
}

bool TcpBootstrap::failedElsewhere(std::string* why, std::chrono::milliseconds wait) {
  Impl& I = *impl_;
  const auto until = Clock::now() + wait;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(I.failMu);
      if (!I.elsewhere.empty()) {
        *why = I.elsewhere;
        return true;
      }
      if (I.failed) return false;  // this rank's own failure, or one it named itself
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    std::unique_lock<std::mutex> lock(I.mu, std::try_to_lock);
    if (lock.owns_lock()) {  // else a receiving call serves the sockets
      try {
        std::vector<pollfd> none;
        I.service(none, static_cast<int>(std::clamp<long long>(left.count(), 0, 10)));
      } catch (const Error&) {  // the failure, recorded
      }
    } else if (left.count() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<long long>(left.count(), 10)));
    }
    if (Clock::now() >= until) {
      std::lock_guard<std::mutex> fl(I.failMu);
      if (I.elsewhere.empty()) return false;
      *why = I.elsewhere;
      return true;
    }
  }
}

bool TcpBootstrap::tryRecvAny(int tag, int* from, void* data, size_t size) {
  Impl& I = *impl_;
  std::unique_lock<std::mutex> lock(I.mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  I.serveArrived();
  for (auto it = I.unexpected.begin(); it != I.unexpected.end();) {
    if (it->tag != tag) {
      ++it;
    } else if (it->data.size() != size) {
      it = I.unexpected.erase(it);
    } else {
      *from = it->rank;
      if (size) std::memcpy(data, it->data.data(), size);
      I.unexpected.erase(it);
      return true;
    }
  }
  return false;
}

std::string TcpBootstrap::peerHost(int peer) const {
  SocketAddress a;
  if (peer < 0 || peer >= nRanks_ || !SocketAddress::fromWire(impl_->peers[peer], &a)) return "";
  return a.host();
}

bool TcpBootstrap::hasMessage(int peer, int tag) {
  Impl& I = *impl_;
  std::unique_lock<std::mutex> lock(I.mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  I.serveArrived();
  for (const auto& m : I.unexpected)
    if (m.rank == peer && m.tag == tag) return true;
  return false;
}

void TcpBootstrap::allGather(void* data, size_t size) {
  Impl& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mu);
  I.throwIfFailed();
  if (nRanks_ == 1 || size == 0) return;
  I.ringAllGather(data, size);
}

void TcpBootstrap::send(int peer, int tag, const void* data, size_t size) {
  Impl& I = *impl_;
  if (peer < 0 || peer >= nRanks_) fail(StatusCode::kInvalidArgument, "bootstrap send to rank {} of {}", peer, nRanks_);
  if (tag < 0 && tag != kTagBcast) fail(StatusCode::kInvalidArgument, "bootstrap send: tag {} is negative", tag);
  if (size > I.opts.maxMessageBytes) fail(StatusCode::kInvalidArgument, "bootstrap message of {} bytes is over the limit", size);
  I.throwIfFailed();
  const auto until = I.deadline();
  std::string what = fmt::format("rank {} sending tag {} to rank {}", rank_, tag, peer);
  SocketAddress a;
  SocketAddress::fromWire(I.peers[peer], &a);
  try {
    Socket s = Socket::connect(a, until, abortable(I.opts.abortFlag, [&] { I.throwIfFailed(); }), what,
                               /*retryRefused=*/false);  // every rank listens once the bootstrap is up
    I.sendSealed(s, peer, Header{I.magic, rank_, tag, size}, data, until, abortable(I.opts.abortFlag), what);
  } catch (const Error& e) {
    I.throwIfFailed();
    if (e.code() != StatusCode::kRemoteError) throw;
    // The peer is gone. Name it to everyone; a receiving call of another thread will see the others' messages.
    std::string text = fmt::format("rank {} died during {} (rank {} could not send to it)", peer, I.currentPhase(), rank_);
    I.tellOthers(text, peer);
    I.failWith(StatusCode::kRemoteError, fmt::format("rank {}: {}", rank_, text));
  }
}

void TcpBootstrap::recv(int peer, int tag, void* data, size_t size) {
  Impl& I = *impl_;
  if (peer < 0 || peer >= nRanks_) fail(StatusCode::kInvalidArgument, "bootstrap recv from rank {} of {}", peer, nRanks_);
  if (tag < 0 && tag != kTagBcast) fail(StatusCode::kInvalidArgument, "bootstrap recv: tag {} is negative", tag);
  std::lock_guard<std::mutex> lock(I.mu);
  I.throwIfFailed();
  auto find = [&] {
    for (auto it = I.unexpected.begin(); it != I.unexpected.end(); ++it)
      if (it->rank == peer && it->tag == tag) return it;
    return I.unexpected.end();
  };
  I.waitUntil([&] { return find() != I.unexpected.end(); }, I.deadline(),
              fmt::format("rank {} waiting for tag {} from rank {} during {}", rank_, tag, peer, I.currentPhase()));
  auto it = find();
  if (it->data.size() != size)
    fail(StatusCode::kRemoteError, "rank {}: message tag {} from rank {} has {} bytes, {} expected", rank_, tag, peer,
         it->data.size(), size);
  if (size) std::memcpy(data, it->data.data(), size);
  I.unexpected.erase(it);
}

AuthKey TcpBootstrap::childKey(std::string_view context) const { return impl_->key.child(context); }

std::string TcpBootstrap::childRootHost() const {
  SocketAddress a = impl_->listenAddr;
  a.setPort(0);
  return a.toString();
}

// send() for the survivors of a failed job: no word of the failure stops it, and a peer that cannot be reached is
// this call's failure alone (it is not told to the job).
void TcpBootstrap::sendSurvivor(int peer, int tag, const void* data, size_t size) {
  Impl& I = *impl_;
  if (peer < 0 || peer >= nRanks_ || peer >= static_cast<int>(I.peers.size()))
    fail(StatusCode::kInvalidArgument, "bootstrap send to rank {} of {}", peer, nRanks_);
  if (tag < 0) fail(StatusCode::kInvalidArgument, "bootstrap send: tag {} is negative", tag);
  if (size > I.opts.maxMessageBytes) fail(StatusCode::kInvalidArgument, "bootstrap message of {} bytes is over the limit", size);
  const auto until = I.deadline();
  std::string what = fmt::format("rank {} sending tag {} to rank {}", rank_, tag, peer);
  SocketAddress a;
  SocketAddress::fromWire(I.peers[peer], &a);
  try {
    Socket s = Socket::connect(a, until, Interrupt{}, what, /*retryRefused=*/false);
    I.sendSealed(s, peer, Header{I.magic, rank_, tag, size}, data, until, Interrupt{}, what);
  } catch (const Error& e) {
    fail(StatusCode::kRemoteError, "rank {}: rank {} cannot be reached at {} (it died, or left): {}", rank_, peer,
         a.toString(), e.what());
  }
}

// recv() for the survivors of a failed job: serves the connections as recv() does, and a failure of the job told
// meanwhile is recorded (failedElsewhere) without ending the wait.
void TcpBootstrap::recvSurvivor(int peer, int tag, void* data, size_t size) {
  Impl& I = *impl_;
  if (peer < 0 || peer >= nRanks_) fail(StatusCode::kInvalidArgument, "bootstrap recv from rank {} of {}", peer, nRanks_);
  if (tag < 0) fail(StatusCode::kInvalidArgument, "bootstrap recv: tag {} is negative", tag);
  std::lock_guard<std::mutex> lock(I.mu);
  const auto until = I.deadline();
  while (true) {
    for (auto it = I.unexpected.begin(); it != I.unexpected.end(); ++it) {
      if (it->rank != peer || it->tag != tag) continue;
      if (it->data.size() != size)
        fail(StatusCode::kRemoteError, "rank {}: message tag {} from rank {} has {} bytes, {} expected", rank_, tag,
             peer, it->data.size(), size);
      if (size) std::memcpy(data, it->data.data(), size);
      I.unexpected.erase(it);
      return;
    }
    if (Clock::now() >= until)
      fail(StatusCode::kTimeout, "rank {}: timeout: no message (tag {}) from rank {} in {} s (TOPOCOLL_TIMEOUT)", rank_,
           tag, peer, std::chrono::duration_cast<std::chrono::seconds>(I.opts.timeout).count());
    std::vector<pollfd> none;
    I.pump(none, pollSlice(until));
  }
}

}  // namespace topocoll::bootstrap
