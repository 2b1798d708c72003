// Ranks as threads of one process over the in-memory bootstrap, each with its own knobs.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

namespace topocoll::testing {

enum class Transport { kP2p, kShm, kNet };
inline const char* name(Transport t) { return t == Transport::kP2p ? "P2P" : t == Transport::kShm ? "SHM" : "NET"; }

/// Knobs that force `t` between ranks of one process: P2P by default, NCCL_P2P_DISABLE for SHM, one "host" per rank
/// (NCCL_HOSTID) for NET.
inline void force(Transport t, int rank, Config& cfg) {
  cfg.hostId = t == Transport::kNet ? "net-host" + std::to_string(rank) : "one-host";
  if (t == Transport::kShm) {
    cfg.p2pDisable = 1;
    cfg.p2pLevel = 0;
  }
}

/// Runs `body(comm, rank)` on `n` threads, each with a communicator over one in-memory group; `configure` adjusts
/// each rank's options. Returns each rank's error message ("" when none).
inline std::vector<std::string> runRanks(int n, const std::function<void(int, runtime::InitOptions&)>& configure,
                                         const std::function<void(runtime::Communicator&, int)>& body) {
  bootstrap::Options bo;
  bo.timeout = std::chrono::seconds(60);
  auto group = bootstrap::makeInMemoryGroup(n, bo);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        runtime::InitOptions o;
        o.cfg.timeoutSec = 60;
        configure(r, o);
        o.bootstrap = bo;
        auto comm = runtime::Communicator::initWithBootstrap(std::move(group[r]), o);
        body(*comm, r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

/// Every rank's body ended without an error (runRanks's result).
inline void expectNoErrors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

/// `f` throws an Error of `code` whose message contains `text`.
template <typename F>
void expectError(F&& f, StatusCode code, const char* text) {
  try {
    f();
    ADD_FAILURE() << "no error, expected " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

/// The communicators of `n` ranks of one host in this process, made by `n` threads at once over one in-memory group
/// (init is collective), for a test that then drives several of them from one thread (NCCL's single-process
/// multi-GPU pattern).
inline std::vector<std::unique_ptr<runtime::Communicator>> initLocalComms(int n) {
  auto group = bootstrap::makeInMemoryGroup(n);
  std::vector<std::unique_ptr<runtime::Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      runtime::InitOptions o;
      o.cfg.hostId = "one-host";
      comms[r] = runtime::Communicator::initWithBootstrap(std::move(group[r]), o);
    });
  for (auto& t : threads) t.join();
  return comms;
}

/// Runs `calls` (sends and receives) inside one group; returns "no error", or the group's error message, whose code
/// must be `expected`.
inline std::string groupError(const std::function<void()>& calls, StatusCode expected) {
  try {
    runtime::groupStart();
    calls();
    runtime::groupEnd();
    return "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.what();
  }
}

/// Entries of a /proc directory (open descriptors, threads).
inline int countEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

}  // namespace topocoll::testing
