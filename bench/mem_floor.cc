// The memory system's floor under the host collectives (docs/performance.md, "Where the large sizes stop").
// A collective on one host must at least write its outputs (and read its inputs); several ranks' copies share the
// machine's memory bandwidth, which does not grow with the threads as fast as the threads do. This measures, for 1
// to N threads at once (each on its own buffers, as ranks are): non-temporal writes (the stores the large
// collectives use), reads, and non-temporal copies (copyStreaming), in GB/s of all threads together; then the floor
// of each collective at the size given: the time its writes alone take at the best write rate of min(ranks, CPUs)
// threads, and its reads at the best read rate, whichever is longer. The data written is not zero: on the project's
// AMD VM non-temporal stores of zeros ran 1.7-2.8x faster than of other bytes (a floor measured with zeros is not
// one for real data). The last column, nt-fanout, writes every byte read twice (64 KiB blocks copied to two places,
// the second copy from the cache): the shape of a 2-rank AllGather that pushes its input into both outputs; its
// rate counts the bytes written.
//
//   build/bench/mem_floor [-s MiB (64)] [-r rounds (5)] [-n "2 4"]
#include <topocoll/memcopy.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

enum class Op { kWrite, kRead, kCopy, kFanout };

struct Buffers {
  std::vector<char*> src, dst;
  size_t bytes;
};

// Sum of 8-byte words (the compiler vectorises it): every line of [p, p + bytes) is read.
uint64_t readAll(const char* p, size_t bytes) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t s = 0;
  for (size_t i = 0; i < bytes / 8; ++i) s += w[i];
  return s;
}

// GB/s of all `threads` together, median over `rounds` (each thread moves `bytes`).
double measure(Op op, int threads, Buffers& b, int rounds) {
  alignas(64) static char zeros[64 << 10];
  if (zeros[0] == 0) std::memset(zeros, 0x5a, sizeof zeros);  // data, not the zero page
  std::vector<double> rates;
  std::vector<uint64_t> sinks(threads);
  for (int r = 0; r < rounds + 1; ++r) {
    auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        if (op == Op::kRead) sinks[t] += readAll(b.src[t], b.bytes);
        else if (op == Op::kCopy) topocoll::copyStreaming(b.dst[t], b.src[t], b.bytes);
        else if (op == Op::kFanout)
          for (size_t o = 0, half = b.bytes / 2; o < half; o += sizeof zeros) {
            size_t n = std::min(sizeof zeros, half - o);
            topocoll::copyStreaming(b.dst[t] + o, b.src[t] + o, n);
            topocoll::copyStreaming(b.dst[t] + half + o, b.src[t] + o, n);
          }
        else
          for (size_t o = 0; o < b.bytes; o += sizeof zeros)
            topocoll::copyStreaming(b.dst[t] + o, zeros, std::min(sizeof zeros, b.bytes - o));
      });
    for (auto& t : ts) t.join();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) rates.push_back(static_cast<double>(b.bytes) * threads / s / 1e9);  // round 0 warms up
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 64;
  int rounds = 5;
  std::vector<int> ranks{2, 4};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "-s" || a == "-r" || a == "-n") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "-s") mib = std::strtoull(v.c_str(), nullptr, 10);
      if (a == "-r") rounds = std::atoi(v.c_str());
      if (a == "-n") {
        ranks.clear();
        for (size_t p = 0; p < v.size();) {
          size_t q = v.find_first_of(" ,", p);
          if (q == std::string::npos) q = v.size();
          if (q > p) ranks.push_back(std::atoi(v.substr(p, q - p).c_str()));
          p = q + 1;
        }
      }
    } else {
      std::fprintf(stderr, "usage: mem_floor [-s MiB (64)] [-r rounds (5)] [-n \"2 4\"]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  if (mib == 0 || rounds < 1 || ranks.empty()) {
    std::fprintf(stderr, "mem_floor: -s and -r must be positive, -n non-empty\n");
    return 2;
  }
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Buffers b{{}, {}, mib << 20};
  for (int t = 0; t < cpus; ++t) {
    b.src.push_back(static_cast<char*>(std::aligned_alloc(4096, b.bytes)));
    b.dst.push_back(static_cast<char*>(std::aligned_alloc(4096, b.bytes)));
    std::memset(b.src.back(), 1, b.bytes);
    std::memset(b.dst.back(), 2, b.bytes);
  }
  fmt::print("# {} MiB per thread, median of {} rounds; GB/s of all threads together\n", mib, rounds);
  fmt::print("{:>8} {:>10} {:>10} {:>10} {:>10}\n", "threads", "nt-write", "read", "nt-copy", "nt-fanout");
  std::vector<double> bestW(cpus + 1), bestR(cpus + 1);
  for (int t = 1; t <= cpus; ++t) {
    double w = measure(Op::kWrite, t, b, rounds), r = measure(Op::kRead, t, b, rounds),
           c = measure(Op::kCopy, t, b, rounds), f = measure(Op::kFanout, t, b, rounds);
    bestW[t] = std::max(w, bestW[t - 1]);
    bestR[t] = std::max(r, bestR[t - 1]);
    fmt::print("{:>8} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", t, w, r, c, f);
  }
  // Out of place, nccl-tests' sizes S (AllGather: the output; ReduceScatter: the input): bytes every rank together
  // must write and read at least.
  const double S = static_cast<double>(b.bytes);
  fmt::print("\n# floor at {} MiB: max(writes / best write rate, reads / best read rate) of min(ranks, {}) threads\n",
             mib, cpus);
  fmt::print("{:>15} {:>6} {:>12} {:>12} {:>10}\n", "collective", "ranks", "written MB", "read MB", "floor us");
  for (int n : ranks) {
    const int th = std::min(n, cpus);
    struct Row {
      const char* coll;
      double written, read;
    } rows[] = {
        {"allreduce", n * S, n * S},        // every output; every input once (its reducer)
        {"allgather", n * S, S},            // every output; every input once (from cache for the others at best)
        {"reduce_scatter", S, n * S},       // every output (S/n each); every input once
        {"broadcast", n * S, S},            // the root's copy and every receiver's
    };
    for (const Row& r : rows) {
      double us = std::max(r.written / (bestW[th] * 1e9), r.read / (bestR[th] * 1e9)) * 1e6;
      fmt::print("{:>15} {:>6} {:>12.0f} {:>12.0f} {:>10.0f}\n", r.coll, n, r.written / 1e6, r.read / 1e6, us);
    }
  }
  for (int t = 0; t < cpus; ++t) std::free(b.src[t]), std::free(b.dst[t]);
  return 0;
}
