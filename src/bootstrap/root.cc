#include "root.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll::bootstrap {

namespace {

// A connection must send its whole registration within this; idle or slow ones are dropped (the others are read
// meanwhile, so this bounds what a stranger holds, not how long the job waits).
constexpr auto kRegistrationWait = std::chrono::seconds(10);
constexpr size_t kMaxPending = 4096;
constexpr auto kReplyDeadline = std::chrono::seconds(2);
// A failed root's process stays this long after the last connection came for ranks still on their way.
constexpr auto kLingerQuiet = std::chrono::seconds(3);

}  // namespace

// The root's state: connections that have not registered yet, the ranks that have, and the job's fate.
struct Root::Impl {
  struct Pending {
    Socket sock;
    Handshake auth;  // until it is done, the connection's bytes are the authentication exchange's
    MessageParser parser;
    Clock::time_point deadline;
  };
  struct Member {
    int rank;
    Socket sock;  // kept until the rank's bootstrap is complete: the root tells it the job's failures
    MessageParser parser;
    bool ready = false;
    bool muted = false;  // sent something malformed: no longer read, but still answered
  };

  uint64_t magic = 0;
  AuthKey key;
  std::string where;  // the root's address, for messages
  RegistrationBook book;
  std::vector<Pending> pending;
  std::vector<Member> members;
  bool answered = false, finished = false;
  std::string failure;
  StatusCode failureCode = StatusCode::kOk;
  std::vector<uint8_t> told;  // ranks that know the failure
  int toldCount = 0;
  Clock::time_point reportMissingAt = Clock::time_point::max();

  MessageParser::Rules registrationRules() const { return {magic, 0, sizeof(Registration)}; }
  MessageParser::Rules controlRules() const { return {magic, book.nRanks(), kMaxControlBytes}; }

  void sendError(Socket& s, StatusCode code, const std::string& text) {
    std::vector<uint8_t> body(1 + text.size());
    body[0] = static_cast<uint8_t>(code);
    std::copy(text.begin(), text.end(), body.begin() + 1);
    trySend(s, Header{magic, -1, kTagError, body.size()}, body.data(), Clock::now() + kReplyDeadline);
  }

  void markTold(int rank) {
    if (told.empty() && book.nRanks() > 0) told.assign(book.nRanks(), 0);
    if (rank >= 0 && rank < static_cast<int>(told.size()) && !told[rank]) {
      told[rank] = 1;
      ++toldCount;
    }
  }
  bool everyoneTold() const { return !failure.empty() && book.nRanks() > 0 && toldCount == book.nRanks(); }

  // The job cannot complete: every registered rank is told why, and so is every rank that registers later.
  void failJob(StatusCode code, const std::string& text) {
    if (!failure.empty()) return;
    failure = text;
    failureCode = code;
    TC_WARN("Bootstrap : root {}: {}", where, text);
    for (auto& m : members) {
      if (m.sock.valid()) sendError(m.sock, code, text);
      m.sock = Socket();
      markTold(m.rank);  // a rank whose connection closed left already
    }
  }

  void drop(Pending& p, const std::string& why) {
    TC_WARN("Bootstrap : root {}: dropped a connection from {}: {}", where, p.sock.peerName(), why);
    p.sock = Socket();
  }

  void answerAll() {
    int n = book.nRanks();
    for (auto& m : members) {
      WireAddr next = book.of((m.rank + 1) % n).listen;
      if (!trySend(m.sock, Header{magic, -1, kTagRegister, sizeof(next)}, &next, Clock::now() + kReplyDeadline))
        TC_WARN("Bootstrap : root {}: could not answer rank {}", where, m.rank);
    }
    answered = true;
    TC_INFO(log::kBootstrap, "Bootstrap : root {}: all {} ranks registered", where, n);
  }

  void onRegistration(Pending& p) {
    const Header& h = p.parser.header();
    if (!failure.empty()) {  // a latecomer of a failed job learns why at once
      if (h.tag == kTagRegister) {
        sendError(p.sock, failureCode, failure);
        markTold(h.rank);
      }
      p.sock = Socket();
      return;
    }
    std::string why;
    switch (book.add(h, p.parser.body(), &why)) {
      case RegistrationBook::Verdict::kDropped:
        drop(p, why);
        return;
      case RegistrationBook::Verdict::kJobFails:
        sendError(p.sock, StatusCode::kInvalidUsage, why);
        p.sock = Socket();
        failJob(StatusCode::kInvalidUsage, why);
        markTold(h.rank);
        return;
      case RegistrationBook::Verdict::kAccepted:
        break;
    }
    if (book.registered() == 1) {
      auto timeout = std::chrono::milliseconds(book.timeoutMs());
      auto margin = std::max<std::chrono::milliseconds>(timeout / 10, std::chrono::milliseconds(50));
      reportMissingAt = Clock::now() + timeout - margin;
    }
    Member m{h.rank, std::move(p.sock), MessageParser(controlRules())};
    members.push_back(std::move(m));
    if (book.complete()) answerAll();
  }

  // A rank of another job (its magic differs) is told so instead of waiting for its timeout.
  void refuse(Pending& p) {
    const Header& h = p.parser.header();
    if (h.tag == kTagRegister && h.size == sizeof(Registration)) {
      std::string text = "connected to a different job's root at " + where;
      trySend(p.sock, Header{h.magic, -1, kTagRefused, text.size()}, text.data(), Clock::now() + kReplyDeadline);
      // The registration's body is still unread here: closing over unread bytes sends a reset, which can reach the
      // rank before the refusal does (it would then see "connection reset" instead of why). Read it first.
      char body[sizeof(Registration)];
      for (size_t got = 0; got < sizeof(body);) {
        const ssize_t n = ::recv(p.sock.fd(), body + got, sizeof(body) - got, MSG_DONTWAIT);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
    }
    drop(p, p.parser.why());
  }

  // False while the connection has not proved itself (or was dropped for failing to).
  bool stepAuth(Pending& p) {
    IoStatus st = p.auth.step(p.sock);
    if (st.broken()) drop(p, "authentication failed: " + p.auth.why());
    return st.done();
  }

  void onPendingReadable(Pending& p) {
    if (!p.auth.done() && (!stepAuth(p) || !p.sock.valid())) return;
    switch (readMessage(p.sock, p.parser)) {
      case ReadStatus::kWaiting:
        return;
      case ReadStatus::kClosed:
        drop(p, p.parser.headerComplete() ? "closed in the middle of a registration" : "closed before a registration");
        return;
      case ReadStatus::kRejected:
        if (p.parser.foreignMagic()) refuse(p);
        else drop(p, p.parser.why());
        return;
      case ReadStatus::kMessage:
        onRegistration(p);
        return;
    }
  }

  void onMemberReadable(Member& m) {
    while (m.sock.valid()) {
      auto st = readMessage(m.sock, m.parser);
      if (st == ReadStatus::kWaiting) return;
      if (st == ReadStatus::kMessage && m.parser.header().tag == kTagReady) {
        m.ready = true;
        m.parser.reset();
        continue;
      }
      if (st == ReadStatus::kMessage && m.parser.header().tag == kTagAbort) {
        const auto& b = m.parser.body();
        failJob(StatusCode::kRemoteError, std::string(b.begin(), b.end()));
        return;
      }
      if (st == ReadStatus::kClosed) {
        m.sock = Socket();
        if (!m.ready)
          failJob(StatusCode::kRemoteError,
                  fmt::format("rank {} died during {} (its connection to the root closed)", m.rank,
                              answered ? "bootstrap ring setup" : "registration with the root"));
        return;
      }
      TC_WARN("Bootstrap : root {}: rank {} sent {}; no longer reading it", where, m.rank,
              st == ReadStatus::kRejected ? m.parser.why() : "an unexpected message");
      m.muted = true;
      return;
    }
  }

  void acceptAll(Socket& listener) {
    while (true) {
      Socket c;
      try {
        c = listener.acceptNow();
      } catch (const Error& e) {  // out of descriptors: the oldest stranger makes room
        if (pending.empty()) return;
        drop(pending.front(), std::string("out of descriptors (") + e.what() + ")");
        pending.erase(pending.begin());
        continue;
      }
      if (!c.valid()) return;
      if (pending.size() >= kMaxPending) {
        drop(pending.front(), "too many connections that have not registered");
        pending.erase(pending.begin());
      }
      pending.push_back(Pending{std::move(c), Handshake(key, Handshake::Role::kAcceptor),
                                MessageParser(registrationRules()), Clock::now() + kRegistrationWait});
      stepAuth(pending.back());  // sends the challenge
    }
  }
};

Root::Root(const SocketAddress& bindAddr, uint64_t magic, int nRanks, const AuthKey& key) : key_(key), nRanks_(nRanks) {
  try {
    listener_ = Socket::listen(bindAddr, &addr_);
  } catch (const Error& e) {
    fail(e.code(), "bootstrap root: {} (set NCCL_COMM_ID or MASTER_PORT to a free port for this job)", e.what());
  }
  std::random_device rd;
  magic_ = magic ? magic : (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0x746f706f636f6c6cULL;
  thread_ = std::thread([this] { run(); });
}

Root::~Root() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Root::abort(const std::string& reason, Clock::time_point until) {
  {
    std::lock_guard<std::mutex> lock(ctlMu_);
    abortRequest_ = reason;
  }
  const auto started = Clock::now();
  while (!everyoneTold_ && Clock::now() < until) {
    auto last = std::max(started, Clock::time_point(Clock::duration(lastArrival_.load())));
    if (Clock::now() - last >= kLingerQuiet) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Root::run() {
  Impl st;
  st.magic = magic_;
  st.key = key_;
  st.where = addr_.toString();
  st.book = RegistrationBook(nRanks_);
  try {
    while (!stop_ && !st.finished) {
      std::vector<pollfd> fds;
      fds.push_back({listener_.fd(), POLLIN, 0});
      for (auto& p : st.pending) fds.push_back({p.sock.fd(), POLLIN, 0});
      for (auto& m : st.members) fds.push_back({m.sock.valid() && !m.muted ? m.sock.fd() : -1, POLLIN, 0});
      int r = ::poll(fds.data(), fds.size(), 100);
      if (r < 0 && errno != EINTR) fail(StatusCode::kSystemError, "poll: {}", std::strerror(errno));
      const size_t nPending = st.pending.size(), nMembers = st.members.size();
      for (size_t i = 0; i < nMembers; ++i)
        if (fds[1 + nPending + i].revents) st.onMemberReadable(st.members[i]);
      for (size_t i = 0; i < nPending; ++i)
        if (fds[1 + i].revents && st.pending[i].sock.valid()) st.onPendingReadable(st.pending[i]);
      auto now = Clock::now();
      for (auto& p : st.pending)
        if (p.sock.valid() && now >= p.deadline)
          st.drop(p, fmt::format("no registration within {} s", kRegistrationWait.count()));
      std::erase_if(st.pending, [](const Impl::Pending& p) { return !p.sock.valid(); });
      if (fds[0].revents) {
        st.acceptAll(listener_);
        lastArrival_ = Clock::now().time_since_epoch().count();
      }
      if (!st.answered && st.failure.empty() && now >= st.reportMissingAt)
        st.failJob(StatusCode::kTimeout, st.book.missingText());
      {
        std::lock_guard<std::mutex> lock(ctlMu_);
        if (!abortRequest_.empty()) st.failJob(StatusCode::kRemoteError, abortRequest_);
      }
      everyoneTold_ = st.everyoneTold();
      if (st.answered && st.failure.empty() &&
          std::all_of(st.members.begin(), st.members.end(), [](const Impl::Member& m) { return m.ready; }))
        st.finished = true;
    }
  } catch (const Error& e) {
    TC_WARN("Bootstrap : root {}: {}", st.where, e.what());
  }
  everyoneTold_ = true;  // nobody is listening any more: nothing to wait for
  if (st.finished) listener_ = Socket();  // the job is bootstrapped: later connections are refused at once
  ended_.store(true, std::memory_order_release);
}

}  // namespace topocoll::bootstrap
