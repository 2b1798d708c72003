// The loopback TCP ceiling for NET's point-to-point shapes (issue 10): the best that plain sockets between two
// processes of this machine give, no library, for exactly the shapes topocoll-perf and the peers' benchmarks time.
//
//   pingpong: rank 0 sends S bytes, rank 1 receives them and sends S bytes back; time = round trip / 2.
//   sendrecv: both ranks send S bytes to, and receive S bytes from, the other at once; time per exchange.
//
// Each size runs a set of variants (how the bytes are moved) and reports the fastest, so the ceiling is the best of
// what was tried, not a bound: one thread with blocking calls, one thread with non-blocking calls (waiting in poll()
// or spinning), a thread per socket and direction, 1/2/4 sockets with the message striped over them, chunk sizes per
// call, SO_SNDBUF/SO_RCVBUF forced; the main ones also with rank r bound to CPU r (as topocoll-perf -np and mpirun
// -np 2 bind; the others float, as Gloo's ranks). The timing protocol is the peers' (../shared/peers/README.md): one
// op and a barrier, an estimate, a warm-up, a barrier, then iters = clamp(T / estimate, 3, 10^6) back-to-back ops;
// time = the maximum over both ranks of elapsed / iters. After the timed loop each receiver checks its buffer once
// (#wrong).
// Not tried: MSG_ZEROCOPY (over loopback the kernel copies such data anyway, see the kernel's msg_zerocopy.rst) and
// vmsplice+splice (a probe was slower one-way: 29-31 against 23-25 ms at 64 MiB).
//
//   net_ceiling [-b MIN -e MAX -f FACTOR | -l s1,s2,...] [-T SECONDS] [-c pingpong,sendrecv] [-v]
//
// Prints nccl-tests rows (size count type redop root time algbw busbw #wrong) with the winning variant after them;
// -v adds a '#' line per variant. bench/p2p_compare.sh uses it as the "TCP ceiling" column of the NET rows.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace {

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "net_ceiling: {}: {}\n", what, std::strerror(errno));
  std::_Exit(1);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum class Engine { kBlocking, kPoll, kSpin };

struct Variant {
  const char* name;
  Engine engine;
  int socks;     // the message is striped over this many connections
  size_t chunk;  // at most this many bytes per send/recv call; 0: all that is left
  int buf;       // SO_SNDBUF and SO_RCVBUF forced to this; 0: the kernel's autotuning
  bool pin = false;  // rank r and its threads bound to CPU r (as topocoll-perf -np and mpirun -np 2 bind)
};

constexpr size_t kK = 1024, kM = 1024 * 1024;
// Blocking engines: pingpong with one socket is one thread; otherwise a thread per socket (pingpong) or per socket
// and direction (sendrecv).
const Variant kVariants[] = {
    {"block", Engine::kBlocking, 1, 0, 0},
    {"block/chunk1M", Engine::kBlocking, 1, kM, 0},
    {"block/buf16M", Engine::kBlocking, 1, 0, 16 << 20},
    {"poll/256K", Engine::kPoll, 1, 256 * kK, 0},
    {"poll/1M", Engine::kPoll, 1, kM, 0},
    {"poll/4M", Engine::kPoll, 1, 4 * kM, 0},
    {"spin/1M", Engine::kSpin, 1, kM, 0},
    {"poll/1M/buf1M", Engine::kPoll, 1, kM, 1 << 20},
    {"poll/1M/buf16M", Engine::kPoll, 1, kM, 16 << 20},
    {"block/2sock", Engine::kBlocking, 2, 0, 0},
    {"block/4sock", Engine::kBlocking, 4, 0, 0},
    {"poll/1M/2sock", Engine::kPoll, 2, kM, 0},
    {"poll/1M/4sock", Engine::kPoll, 4, kM, 0},
    {"pin/block", Engine::kBlocking, 1, 0, 0, true},
    {"pin/poll/1M", Engine::kPoll, 1, kM, 0, true},
    {"pin/poll/4M", Engine::kPoll, 1, 4 * kM, 0, true},
    {"pin/block/2sock", Engine::kBlocking, 2, 0, 0, true},
    {"pin/poll/1M/2sock", Engine::kPoll, 2, kM, 0, true},
    {"pin/poll/1M/4sock", Engine::kPoll, 4, kM, 0, true},
};

// The control channel between the two processes (an AF_UNIX socketpair): barriers and small values.
struct Control {
  int fd;
  void put(const void* p, size_t n) const {
    if (::write(fd, p, n) != static_cast<ssize_t>(n)) die("control write");
  }
  void get(void* p, size_t n) const {
    auto* c = static_cast<char*>(p);
    while (n) {
      ssize_t r = ::read(fd, c, n);
      if (r <= 0) die("control read");
      c += r, n -= static_cast<size_t>(r);
    }
  }
  template <class T> T exchange(T v) const {
    put(&v, sizeof v);
    T o;
    get(&o, sizeof o);
    return o;
  }
  void barrier() const { exchange<char>(0); }
};

void setInt(int fd, int level, int opt, int v) { ::setsockopt(fd, level, opt, &v, sizeof v); }

void setBuf(int fd, int buf) {
  if (buf == 0) return;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) != 0) setInt(fd, SOL_SOCKET, SO_SNDBUF, buf);
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) != 0) setInt(fd, SOL_SOCKET, SO_RCVBUF, buf);
}

// n connected sockets, in the same order on both sides (the connecting side sends its index first).
std::vector<int> connectPair(const Control& ctl, int rank, int n, int buf) {
  std::vector<int> fds(n, -1);
  if (rank == 0) {
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) die("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setBuf(l, buf);  // accepted sockets inherit it, and the window scale is fixed at the handshake
    socklen_t al = sizeof a;
    if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, n) != 0 ||
        ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &al) != 0)
      die("listen");
    ctl.put(&a.sin_port, sizeof a.sin_port);
    for (int i = 0; i < n; ++i) {
      int s = ::accept(l, nullptr, nullptr);
      uint8_t idx = 0;
      if (s < 0 || ::recv(s, &idx, 1, MSG_WAITALL) != 1 || idx >= n) die("accept");
      fds[idx] = s;
    }
    ::close(l);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ctl.get(&a.sin_port, sizeof a.sin_port);
    for (int i = 0; i < n; ++i) {
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      setBuf(s, buf);
      auto idx = static_cast<uint8_t>(i);
      if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::send(s, &idx, 1, 0) != 1)
        die("connect");
      fds[i] = s;
    }
  }
  for (int s : fds) setInt(s, IPPROTO_TCP, TCP_NODELAY, 1);
  ctl.barrier();
  return fds;
}

// One connection's share of a message, both directions.
struct Stripe {
  int fd;
  const char* sb;
  char* rb;
  size_t n;
  size_t so = 0, ro = 0;
};

void sendAll(int fd, const char* p, size_t n, size_t chunk) {
  while (n) {
    ssize_t r = ::send(fd, p, chunk ? std::min(chunk, n) : n, MSG_NOSIGNAL);
    if (r <= 0) die("send");
    p += r, n -= static_cast<size_t>(r);
  }
}

void recvAll(int fd, char* p, size_t n, size_t chunk) {
  while (n) {
    ssize_t r = ::recv(fd, p, chunk ? std::min(chunk, n) : n, 0);
    if (r <= 0) die("recv");
    p += r, n -= static_cast<size_t>(r);
  }
}

// One thread, non-blocking calls over every stripe; waits in poll() (or spins) when nothing moved.
void moveNonBlocking(std::vector<Stripe>& st, bool doSend, bool doRecv, size_t chunk, bool spin) {
  for (auto& s : st) s.so = doSend ? 0 : s.n, s.ro = doRecv ? 0 : s.n;
  std::vector<pollfd> pfd(st.size());
  for (;;) {
    bool progress = false, left = false;
    for (auto& s : st) {
      if (s.so < s.n) {
        size_t c = chunk ? std::min(chunk, s.n - s.so) : s.n - s.so;
        ssize_t r = ::send(s.fd, s.sb + s.so, c, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) s.so += static_cast<size_t>(r), progress = true;
        else if (errno != EAGAIN) die("send");
      }
      if (s.ro < s.n) {
        size_t c = chunk ? std::min(chunk, s.n - s.ro) : s.n - s.ro;
        ssize_t r = ::recv(s.fd, s.rb + s.ro, c, MSG_DONTWAIT);
        if (r > 0) s.ro += static_cast<size_t>(r), progress = true;
        else if (r == 0 || errno != EAGAIN) die("recv");
      }
      left = left || s.so < s.n || s.ro < s.n;
    }
    if (!left) return;
    if (progress || spin) continue;
    for (size_t i = 0; i < st.size(); ++i)
      pfd[i] = {st[i].fd, static_cast<short>((st[i].so < st[i].n ? POLLOUT : 0) | (st[i].ro < st[i].n ? POLLIN : 0)), 0};
    if (::poll(pfd.data(), pfd.size(), -1) < 0 && errno != EINTR) die("poll");
  }
}

// Threads that each run one job per op, released and joined by two barriers.
class Workers {
 public:
  explicit Workers(std::vector<std::function<void()>> jobs)
      : jobs_(std::move(jobs)), start_(static_cast<ptrdiff_t>(jobs_.size() + 1)),
        done_(static_cast<ptrdiff_t>(jobs_.size() + 1)) {
    for (auto& j : jobs_)
      threads_.emplace_back([this, &j] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          j();
          done_.arrive_and_wait();
        }
      });
  }
  void run() {
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }
  ~Workers() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& t : threads_) t.join();
  }

 private:
  std::vector<std::function<void()>> jobs_;
  std::barrier<> start_, done_;
  bool stop_ = false;  // written before the start barrier that releases the threads
  std::vector<std::thread> threads_;
};

struct Result {
  double us;
  long wrong;
  long iters;
};

char pattern(int rank, size_t i) { return static_cast<char>((rank + 1) * 31 + i % 251); }

Result measure(const Control& ctl, int rank, bool sendrecv, size_t size, const Variant& v, double targetS) {
  ::alarm(static_cast<unsigned>(60 + 20 * targetS));  // a stuck variant kills the run instead of hanging it
  cpu_set_t floating;
  ::sched_getaffinity(0, sizeof floating, &floating);
  if (v.pin) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(rank % std::max(1, static_cast<int>(std::thread::hardware_concurrency())), &one);
    ::sched_setaffinity(0, sizeof one, &one);  // before the workers start: they inherit it
  }
  auto fds = connectPair(ctl, rank, v.socks, v.buf);
  const size_t alloc = std::max<size_t>(size, 1);
  auto* sb = static_cast<char*>(std::aligned_alloc(4096, (alloc + 4095) / 4096 * 4096));
  auto* rb = static_cast<char*>(std::aligned_alloc(4096, (alloc + 4095) / 4096 * 4096));
  for (size_t i = 0; i < size; ++i) sb[i] = pattern(rank, i);
  std::memset(rb, 0, alloc);
  std::vector<Stripe> st;
  size_t part = v.socks == 1 ? size : size / v.socks / 4096 * 4096;
  for (int i = 0; i < v.socks; ++i) {
    size_t off = part * i, n = i + 1 == v.socks ? size - off : part;
    st.push_back({fds[i], sb + off, rb + off, n});
  }
  // What one op is on this rank, and who runs it.
  const bool first = rank == 0;  // pingpong: rank 0 sends first
  std::function<void()> op;
  std::unique_ptr<Workers> workers;
  if (v.engine != Engine::kBlocking) {
    bool spin = v.engine == Engine::kSpin;
    if (sendrecv) op = [&, spin] { moveNonBlocking(st, true, true, v.chunk, spin); };
    else
      op = [&, spin] {
        moveNonBlocking(st, first, !first, v.chunk, spin);
        moveNonBlocking(st, !first, first, v.chunk, spin);
      };
  } else if (!sendrecv && v.socks == 1) {
    op = [&] {
      auto& s = st[0];
      if (first) sendAll(s.fd, s.sb, s.n, v.chunk), recvAll(s.fd, s.rb, s.n, v.chunk);
      else recvAll(s.fd, s.rb, s.n, v.chunk), sendAll(s.fd, s.sb, s.n, v.chunk);
    };
  } else {
    std::vector<std::function<void()>> jobs;
    for (auto& s : st) {
      if (sendrecv) {
        jobs.push_back([&s, &v] { sendAll(s.fd, s.sb, s.n, v.chunk); });
        jobs.push_back([&s, &v] { recvAll(s.fd, s.rb, s.n, v.chunk); });
      } else {
        jobs.push_back([&s, &v, first] {
          if (first) sendAll(s.fd, s.sb, s.n, v.chunk), recvAll(s.fd, s.rb, s.n, v.chunk);
          else recvAll(s.fd, s.rb, s.n, v.chunk), sendAll(s.fd, s.sb, s.n, v.chunk);
        });
      }
    }
    workers = std::make_unique<Workers>(std::move(jobs));
    op = [&] { workers->run(); };
  }

  op();
  ctl.barrier();
  double t0 = now();
  op();
  double est = now() - t0;
  est = std::max(est, ctl.exchange(est));  // the same on both ranks: so is the warm-up count
  long warm = std::min<long>(50, static_cast<long>(0.05 * targetS / std::max(est, 1e-9)));
  for (long i = 0; i < warm; ++i) op();
  ctl.barrier();
  long iters = std::clamp<long>(static_cast<long>(targetS / std::max(est, 1e-9)), 3, 1000000);
  iters = std::max(iters, ctl.exchange(iters));  // both ranks run the same count
  t0 = now();
  for (long i = 0; i < iters; ++i) op();
  double el = now() - t0;
  el = std::max(el, ctl.exchange(el));
  std::memset(rb, 0, alloc);
  ctl.barrier();
  op();
  long wrong = 0;  // fp32 elements (4 bytes) that differ from the peer's pattern
  for (size_t i = 0; i < size; i += 4) {
    bool bad = false;
    for (size_t k = i; k < std::min(size, i + 4); ++k) bad = bad || rb[k] != pattern(1 - rank, k);
    wrong += bad;
  }
  wrong += ctl.exchange(wrong);
  ctl.barrier();
  workers.reset();
  for (int s : fds) ::close(s);
  std::free(sb);
  std::free(rb);
  ::sched_setaffinity(0, sizeof floating, &floating);
  return {el / static_cast<double>(iters) * 1e6 / (sendrecv ? 1 : 2), wrong, iters};
}

size_t parseSize(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  for (size_t b; (b = s.find(',', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
  out.push_back(s.substr(a));
  return out;
}

void usage() {
  fmt::print(
      "usage: net_ceiling [-b MIN -e MAX -f FACTOR | -l s1,s2,...] [-T SECONDS] [-c pingpong,sendrecv] [-v]\n"
      "The best plain-socket loopback TCP time per size over a set of variants (see the file's header).\n");
}

}  // namespace

int main(int argc, char** argv) {
  size_t minB = 8, maxB = 64 * kM;
  double factor = 2, targetS = 0.2;
  std::vector<size_t> sizes;
  std::vector<std::string> tests = {"pingpong", "sendrecv"};
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(), std::exit(2);
      return argv[++i];
    };
    if (a == "-b") minB = parseSize(next());
    else if (a == "-e") maxB = parseSize(next());
    else if (a == "-f") factor = std::stod(next());
    else if (a == "-l") for (auto& s : split(next())) sizes.push_back(parseSize(s));
    else if (a == "-T") targetS = std::stod(next());
    else if (a == "-c") tests = split(next());
    else if (a == "-v") verbose = true;
    else if (a == "-h" || a == "--help") return usage(), 0;
    else return usage(), 2;
  }
  if (sizes.empty())
    for (size_t s = minB; s <= maxB; s = std::max(s + 1, static_cast<size_t>(static_cast<double>(s) * factor)))
      sizes.push_back(s);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair");
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) die("fork");
  const int rank = pid == 0 ? 1 : 0;
  ::close(sv[rank == 0 ? 1 : 0]);
  Control ctl{sv[rank]};
  for (const auto& test : tests) {
    const bool sendrecv = test == "sendrecv";
    if (!sendrecv && test != "pingpong") {
      if (rank == 0) fmt::print(stderr, "net_ceiling: unknown test '{}'\n", test);
      continue;
    }
    if (rank == 0) {
      fmt::print("# net_ceiling {}: plain TCP over 127.0.0.1, 2 processes, T {} s per variant; time us = {}\n", test,
                 targetS, sendrecv ? "per exchange" : "round trip / 2");
      fmt::print("#{:>11} {:>12} {:>6} {:>6} {:>5} {:>10} {:>7} {:>7} {:>6}  variant\n", "size", "count", "type",
                 "redop", "root", "time", "algbw", "busbw", "#wrong");
    }
    for (size_t size : sizes) {
      Result best{1e300, 0, 0};
      const char* bestName = "";
      long wrong = 0;
      for (const auto& v : kVariants) {
        if (v.socks > 1 && size < 64 * kK * v.socks) continue;  // striping tiny messages only adds calls
        if (v.engine == Engine::kSpin && size < 64 * kK) continue;  // two spinners and a loaded host: milliseconds
        if ((v.chunk || v.buf) && size <= 64 * kK && v.engine == Engine::kBlocking) continue;
        Result r = measure(ctl, rank, sendrecv, size, v, targetS);
        wrong += r.wrong;
        if (rank == 0 && verbose) fmt::print("# {:>10} {:<16} {:>12.2f} us  iters {}  #wrong {}\n", size, v.name, r.us,
                                             r.iters, r.wrong);
        if (r.us < best.us) best = r, bestName = v.name;
      }
      if (rank == 0) {
        double gbs = static_cast<double>(size) / best.us / 1e3;
        fmt::print("{:>12} {:>12} {:>6} {:>6} {:>5} {:>10.2f} {:>7.2f} {:>7.2f} {:>6}  {}\n", size, size / 4, "float",
                   "none", -1, best.us, gbs, gbs, wrong, bestName);
        std::fflush(stdout);
      }
    }
  }
  if (rank == 1) std::_Exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
