// Small sends and receives through the connections' point-to-point mailboxes (docs/transport.md, "Point-to-point
// mailboxes"), ranks as threads: every type and size around the limit, blocking and asynchronous, groups with more
// messages than the mailbox holds, all-to-all, interleaving with collectives and with large messages, the knob off
// against on, mismatches, abort, timeouts and a late message after a timed-out receive.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "ranks.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/transport/oneshot.h"

namespace topocoll::runtime {
namespace {

using testing::expectError;
using testing::expectNoErrors;
using testing::force;
using testing::runRanks;
using testing::Transport;
using Clock = std::chrono::steady_clock;

uint8_t pattern(int src, int dst, size_t i, int salt) {
  return static_cast<uint8_t>(src * 131 + dst * 31 + i * 7 + salt * 13 + 1);
}

std::vector<uint8_t> message(int src, int dst, size_t bytes, int salt) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = pattern(src, dst, i, salt);
  return v;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw Error(StatusCode::kInternal, what);
}

const std::vector<DataType> kTypes = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
                                      DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                                      DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};

// Counts of `t` around the mailbox's limit: 0, 1, 7, the largest that fits, the smallest that does not.
std::vector<size_t> counts(DataType t) {
  size_t fit = transport::kShotMaxBytes / sizeOf(t);
  return {0, 1, 7, fit, fit + 1};
}

struct Params {
  Transport tr;
  int ranks;
  bool mailbox;
};

class EverySize : public ::testing::TestWithParam<Params> {};

// Blocking pingpongs between rank 0 and every other rank, then a grouped ring exchange, every type and count,
// checked exactly; the same with the mailbox off.
TEST_P(EverySize, ArrivesExactly) {
  Params p = GetParam();
  auto errors = runRanks(
      p.ranks,
      [p](int r, InitOptions& o) {
        force(p.tr, r, o.cfg);
        if (!p.mailbox) o.cfg.p2pMailboxMax = 0;
      },
      [&](Communicator& c, int r) {
        const int n = c.nRanks();
        int salt = 0;
        for (DataType t : kTypes)
          for (size_t count : counts(t)) {
            ++salt;
            size_t bytes = count * sizeOf(t);
            for (int q = 1; q < n; ++q) {
              if (r != 0 && r != q) continue;
              int peer = r == 0 ? q : 0;
              std::vector<uint8_t> in(bytes + 1, 0xee);
              if (r == 0) {
                c.send(message(0, q, bytes, salt).data(), count, t, q);
                c.recv(in.data(), count, t, q);
              } else {
                c.recv(in.data(), count, t, 0);
                c.send(message(r, 0, bytes, salt).data(), count, t, 0);
              }
              in.pop_back();
              check(in == message(peer, r, bytes, salt), fmt::format("pingpong {} x {}", count, to_string(t)));
            }
            std::vector<uint8_t> out = message(r, (r + 1) % n, bytes, salt), in(bytes, 0xee);
            groupStart();
            c.send(out.data(), count, t, (r + 1) % n);
            c.recv(in.data(), count, t, (r - 1 + n) % n);
            groupEnd();
            check(in == message((r - 1 + n) % n, r, bytes, salt), fmt::format("ring {} x {}", count, to_string(t)));
          }
      });
  expectNoErrors(errors);
}

INSTANTIATE_TEST_SUITE_P(Ranks, EverySize,
                         ::testing::Values(Params{Transport::kP2p, 2, true}, Params{Transport::kP2p, 3, true},
                                           Params{Transport::kShm, 4, true}, Params{Transport::kNet, 2, true},
                                           Params{Transport::kP2p, 2, false}),
                         [](const auto& info) {
                           return fmt::format("{}{}{}", testing::name(info.param.tr), info.param.ranks,
                                              info.param.mailbox ? "" : "Off");
                         });

// More messages to each peer than the mailbox has slots, every rank's sends posted before its receives in one
// group: the group progresses both, nothing deadlocks. Then an all-to-all mixing mailbox and FIFO sizes.
TEST(MailboxGroups, MoreMessagesThanSlotsEachWayAndAllToAll) {
  for (int n : {2, 4}) {
    auto errors = runRanks(
        n, [](int r, InitOptions& o) { force(Transport::kShm, r, o.cfg); },
        [&](Communicator& c, int r) {
          const int m = 3 * transport::kShotSlots + 1;
          std::vector<std::vector<int32_t>> out(n), in(n);
          for (int q = 0; q < n; ++q) {
            out[q].resize(m);
            in[q].assign(m, -1);
            for (int i = 0; i < m; ++i) out[q][i] = r * 100000 + q * 1000 + i;
          }
          groupStart();
          for (int q = 0; q < n; ++q)
            if (q != r)
              for (int i = 0; i < m; ++i) c.send(&out[q][i], 1, DataType::kInt32, q);
          for (int q = 0; q < n; ++q)
            if (q != r)
              for (int i = 0; i < m; ++i) c.recv(&in[q][i], 1, DataType::kInt32, q);
          groupEnd();
          for (int q = 0; q < n; ++q)
            if (q != r)
              for (int i = 0; i < m; ++i) check(in[q][i] == q * 100000 + r * 1000 + i, "grouped message out of place");
          // All-to-all, sizes alternating around the limit (some through the mailbox, some through the FIFO).
          for (size_t count : {size_t{3}, size_t{64}, size_t{65}, size_t{1000}}) {
            std::vector<std::vector<uint8_t>> o(n), i(n);
            groupStart();
            for (int k = 0; k < n; ++k) {
              int to = (r + k) % n, from = (r - k + n) % n;
              o[to] = message(r, to, count * 4, static_cast<int>(count));
              i[from].assign(count * 4, 0xee);
              c.recv(i[from].data(), count, DataType::kFloat32, from);
              c.send(o[to].data(), count, DataType::kFloat32, to);
            }
            groupEnd();
            for (int q = 0; q < n; ++q)
              check(i[q] == message(q, r, count * 4, static_cast<int>(count)), "all-to-all data");
          }
        });
    expectNoErrors(errors);
  }
}

// One thread groups the small messages of two communicators (NCCL's one-process multi-GPU pattern), more than the
// slots each way: their engines progress the queued mailbox ops. And a group mixing mailbox and FIFO sizes.
TEST(MailboxGroups, OneThreadSeveralCommunicatorsAndMixedSizes) {
  auto comms = testing::initLocalComms(2);
  const int m = transport::kShotSlots + 5;
  std::vector<int32_t> a(m), b(m), ga(m, -1), gb(m, -1);
  for (int i = 0; i < m; ++i) a[i] = i, b[i] = 1000 + i;
  groupStart();
  for (int i = 0; i < m; ++i) comms[0]->send(&a[i], 1, DataType::kInt32, 1);
  for (int i = 0; i < m; ++i) comms[1]->send(&b[i], 1, DataType::kInt32, 0);
  for (int i = 0; i < m; ++i) comms[1]->recv(&ga[i], 1, DataType::kInt32, 0);
  for (int i = 0; i < m; ++i) comms[0]->recv(&gb[i], 1, DataType::kInt32, 1);
  groupEnd();
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
  // Mixed sizes in one group, the same communicators from two threads.
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts(2);
  for (int r = 0; r < 2; ++r)
    ts[r] = std::thread([&, r] {
      try {
        Communicator& c = *comms[r];
        std::vector<std::vector<uint8_t>> out, in;
        for (int i = 0; i < 3 * transport::kShotSlots; ++i) {
          size_t bytes = i % 5 == 4 ? 70000 : 1 + i;
          out.push_back(message(r, 1 - r, bytes, i));
          in.emplace_back(bytes, 0xee);
        }
        groupStart();
        for (auto& o : out) c.send(o.data(), o.size(), DataType::kUint8, 1 - r);
        for (auto& i : in) c.recv(i.data(), i.size(), DataType::kUint8, 1 - r);
        groupEnd();
        for (size_t i = 0; i < in.size(); ++i)
          check(in[i] == message(1 - r, r, in[i].size(), static_cast<int>(i)), "mixed group data");
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  expectNoErrors(errors);
}

// Asynchronous small sends beyond the slots, then receives: the engine's thread progresses the queued ones.
// Messages through the mailbox and through the FIFO interleaved: each receive gets its own send's data whichever
// completes first.
TEST(MailboxOrder, AsyncBeyondTheSlotsAndInterleavedWithLargeMessages) {
  auto errors = runRanks(
      2, [](int r, InitOptions& o) { force(Transport::kP2p, r, o.cfg); },
      [&](Communicator& c, int r) {
        const int m = 2 * transport::kShotSlots + 3;
        std::vector<int64_t> v(m);
        std::vector<Request> reqs;
        if (r == 0) {
          for (int i = 0; i < m; ++i) v[i] = 1000 + i;
          for (int i = 0; i < m; ++i) reqs.push_back(c.isend(&v[i], 1, DataType::kInt64, 1));
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sender runs ahead
          for (int i = 0; i < m; ++i) reqs.push_back(c.irecv(&v[i], 1, DataType::kInt64, 0));
        }
        for (auto& q : reqs) q.wait();
        if (r == 1)
          for (int i = 0; i < m; ++i) check(v[i] == 1000 + i, "async message out of place");
        // small, large, small, large...: sizes alternate between the two paths, both directions at once.
        const size_t big = 300000;
        std::vector<std::vector<uint8_t>> out, in;
        for (int i = 0; i < 8; ++i) {
          size_t bytes = i % 2 ? big : 40 + i;
          out.push_back(message(r, 1 - r, bytes, i));
          in.emplace_back(bytes, 0xee);
        }
        reqs.clear();
        for (int i = 0; i < 8; ++i) reqs.push_back(c.isend(out[i].data(), out[i].size(), DataType::kUint8, 1 - r));
        for (int i = 0; i < 8; ++i) reqs.push_back(c.irecv(in[i].data(), in[i].size(), DataType::kUint8, 1 - r));
        for (int i = 15; i >= 0; --i) reqs[i].wait();  // waited for in reverse
        for (int i = 0; i < 8; ++i) check(in[i] == message(1 - r, r, in[i].size(), i), "interleaved message");
      });
  expectNoErrors(errors);
}

// Point-to-point and the collectives' one-shot path never share a mailbox sequence: a send then an AllReduce on one
// rank, the AllReduce then the receive on the other in a group, and messages between collectives.
TEST(MailboxOrder, InterleavedWithCollectives) {
  auto errors = runRanks(
      3, [](int r, InitOptions& o) { force(Transport::kShm, r, o.cfg); },
      [&](Communicator& c, int r) {
        for (int round = 0; round < 20; ++round) {
          float x = static_cast<float>(r + round), sum = 0;
          int32_t msg = r * 1000 + round, got = -1;
          if (round % 2) {
            groupStart();
            if (r == 0) c.send(&msg, 1, DataType::kInt32, 1);
            c.allReduce(&x, &sum, 1, DataType::kFloat32, RedOp::kSum);
            if (r == 1) c.recv(&got, 1, DataType::kInt32, 0);
            groupEnd();
          } else {  // between collectives (a blocking send waits for its receive outside groups, as NCCL's)
            c.allReduce(&x, &sum, 1, DataType::kFloat32, RedOp::kSum);
            if (r == 0) c.send(&msg, 1, DataType::kInt32, 1);
            if (r == 1) c.recv(&got, 1, DataType::kInt32, 0);
            float y = 1, all = 0;
            c.allReduce(&y, &all, 1, DataType::kFloat32, RedOp::kSum);
            check(all == 3, "allreduce after the message");
          }
          check(sum == static_cast<float>(3 + 3 * round), "allreduce result");
          if (r == 1) check(got == round, "message between collectives");
        }
      });
  expectNoErrors(errors);
}

// A group's leading small messages are recorded without ops (p2p.cc, GroupShot) until something else joins the group:
// an isend/irecv (a Request), a large message or more than 64 of them turn the records into ops first, so each peer's
// messages keep their order; a group of records alone runs in the calling thread, also after the engine's queue was
// busy with asynchronous mailbox ops.
TEST(MailboxOrder, GroupRecordsKeepTheirOrderWhateverJoinsThem) {
  auto errors = runRanks(
      2, [](int r, InitOptions& o) { force(Transport::kP2p, r, o.cfg); },
      [&](Communicator& c, int r) {
        const int peer = 1 - r;
        for (int round = 0; round < 6; ++round) {
          std::vector<int32_t> out(70), in(70, -1);
          for (int i = 0; i < 70; ++i) out[i] = r * 100000 + round * 1000 + i;
          std::vector<uint8_t> bigOut = message(r, peer, 100000, round), bigIn(100000, 0xee);
          std::vector<Request> reqs;
          groupStart();
          for (int i = 0; i < 70; ++i) {
            const bool async = round % 3 == 1 && i % 9 == 4;  // Requests among the records
            if (async) reqs.push_back(c.isend(&out[i], 1, DataType::kInt32, peer));
            else c.send(&out[i], 1, DataType::kInt32, peer);
            if (round % 3 == 2 && i == 10) c.send(bigOut.data(), bigOut.size(), DataType::kUint8, peer);
          }
          for (int i = 0; i < 70; ++i) {
            if (round % 3 == 1 && i % 7 == 3) reqs.push_back(c.irecv(&in[i], 1, DataType::kInt32, peer));
            else c.recv(&in[i], 1, DataType::kInt32, peer);
            if (round % 3 == 2 && i == 10) c.recv(bigIn.data(), bigIn.size(), DataType::kUint8, peer);
          }
          groupEnd();
          for (auto& q : reqs) q.wait();
          for (int i = 0; i < 70; ++i) check(in[i] == peer * 100000 + round * 1000 + i, "grouped message order");
          if (round % 3 == 2) check(bigIn == message(peer, r, 100000, round), "large message in the group");
          // Asynchronous mailbox sends queued on the engine, then a group of two records.
          int32_t a = r + 10 * round, b = -1, x = 7 + r, y = -1;
          Request q = c.isend(&a, 1, DataType::kInt32, peer);
          c.recv(&b, 1, DataType::kInt32, peer);
          q.wait();
          groupStart();
          c.send(&x, 1, DataType::kInt32, peer);
          c.recv(&y, 1, DataType::kInt32, peer);
          groupEnd();
          check(b == peer + 10 * round && y == 7 + peer, "exchange after asynchronous sends");
        }
      });
  expectNoErrors(errors);
}

// Groups of records alone (no spill): 3 ranks, every rank sends to and receives from both others, sends and receives
// interleaved in a different order on each rank, nested groups, over SHM and P2P.
TEST(MailboxOrder, RecordOnlyGroupsAcrossPeersAndNesting) {
  for (Transport tr : {Transport::kShm, Transport::kP2p}) {
    auto errors = runRanks(
        3, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          for (int round = 0; round < 50; ++round) {
            const int a = (r + 1) % 3, b = (r + 2) % 3;
            int64_t toA[3], toB[3], fromA[3] = {-1, -1, -1}, fromB[3] = {-1, -1, -1};
            for (int i = 0; i < 3; ++i) toA[i] = r * 1000 + a * 100 + round * 3 + i, toB[i] = r * 1000 + b * 100 + round * 3 + i;
            groupStart();
            for (int i = 0; i < 3; ++i) {
              if ((r + round) % 2) {
                c.recv(&fromB[i], 1, DataType::kInt64, b);
                groupStart();  // nested: the records stay until the outermost groupEnd
                c.send(&toA[i], 1, DataType::kInt64, a);
                groupEnd();
                c.recv(&fromA[i], 1, DataType::kInt64, a);
                c.send(&toB[i], 1, DataType::kInt64, b);
              } else {
                c.send(&toB[i], 1, DataType::kInt64, b);
                c.send(&toA[i], 1, DataType::kInt64, a);
                c.recv(&fromA[i], 1, DataType::kInt64, a);
                c.recv(&fromB[i], 1, DataType::kInt64, b);
              }
            }
            groupEnd();
            check(groupDepth() == 0, "group depth after groupEnd");
            for (int i = 0; i < 3; ++i)
              check(fromA[i] == a * 1000 + r * 100 + round * 3 + i && fromB[i] == b * 1000 + r * 100 + round * 3 + i,
                    "record-only group data");
          }
        });
    expectNoErrors(errors);
  }
}

// A small receive whose size or type differs from the send: both fail naming both sides, the next message works.
TEST(MailboxFaults, MismatchFailsBothSides) {
  struct Case {
    size_t sendCount;
    DataType sendType;
    size_t recvCount;
    DataType recvType;
  };
  const std::vector<Case> cases = {{8, DataType::kFloat32, 9, DataType::kFloat32},
                                   {8, DataType::kFloat32, 8, DataType::kInt32},
                                   {0, DataType::kInt8, 1, DataType::kInt8}};
  for (Transport tr : {Transport::kP2p, Transport::kShm}) {
    std::vector<std::vector<std::string>> seen(2);
    auto errors = runRanks(
        2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          for (const Case& k : cases) {
            std::vector<uint8_t> buf(64);
            try {
              if (r == 0) c.send(buf.data(), k.sendCount, k.sendType, 1);
              else c.recv(buf.data(), k.recvCount, k.recvType, 0);
              seen[r].push_back("no error");
            } catch (const Error& e) {
              EXPECT_EQ(e.code(), StatusCode::kInvalidUsage) << e.what();
              seen[r].push_back(e.what());
            }
            int32_t v = r == 0 ? 42 : 0;
            if (r == 0) c.send(&v, 1, DataType::kInt32, 1);
            else c.recv(&v, 1, DataType::kInt32, 0);
            check(v == 42, "message after a mismatch");
          }
        });
    expectNoErrors(errors);
    ASSERT_EQ(seen[0].size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      std::string s = fmt::format("{} x {}", cases[i].sendCount, to_string(cases[i].sendType));
      std::string v = fmt::format("{} x {}", cases[i].recvCount, to_string(cases[i].recvType));
      EXPECT_NE(seen[0][i].find("rank 0: send of " + s + " to rank 1"), std::string::npos) << seen[0][i];
      EXPECT_NE(seen[0][i].find("mismatch"), std::string::npos) << seen[0][i];
      EXPECT_NE(seen[0][i].find(v), std::string::npos) << seen[0][i];
      EXPECT_NE(seen[1][i].find("rank 1: recv of " + v + " from rank 0"), std::string::npos) << seen[1][i];
      EXPECT_NE(seen[1][i].find(s), std::string::npos) << seen[1][i];
    }
  }
}

// A group's sends to one peer stream through the slots (each waits for its verdict after the next ones wrote
// theirs): mismatches in a row, and one more than the slots further on, each fail on both sides, and every other
// message of the group arrives. Then the lane works on.
TEST(MailboxFaults, MismatchesAmongStreamedGroupSends) {
  const int m = 2 * transport::kShotSlots + 10;
  auto bad = [](int i) { return i == 3 || i == 4 || i == transport::kShotSlots + 72; };
  for (Transport tr : {Transport::kP2p, Transport::kShm}) {
    std::vector<std::string> seen(2);
    auto errors = runRanks(
        2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          std::vector<std::array<int32_t, 2>> buf(m, {-1, -1});
          for (int i = 0; i < m; ++i) buf[i][0] = r == 0 ? 1000 + i : -1;
          seen[r] = testing::groupError(
              [&] {
                for (int i = 0; i < m; ++i) {
                  if (r == 0) c.send(buf[i].data(), 1, DataType::kInt32, 1);
                  else c.recv(buf[i].data(), bad(i) ? 2 : 1, DataType::kInt32, 0);
                }
              },
              StatusCode::kInvalidUsage);
          if (r == 1)
            for (int i = 0; i < m; ++i)
              if (!bad(i)) check(buf[i][0] == 1000 + i, fmt::format("streamed message {} out of place", i));
          int32_t v = r == 0 ? 42 : 0;
          if (r == 0) c.send(&v, 1, DataType::kInt32, 1);
          else c.recv(&v, 1, DataType::kInt32, 0);
          check(v == 42, "message after the mismatches");
        });
    expectNoErrors(errors);
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(seen[r].find("3 operations failed"), std::string::npos) << "rank " << r << ": " << seen[r];
      EXPECT_NE(seen[r].find("mismatch"), std::string::npos) << seen[r];
    }
  }
}

// Grouped exchanges (a send to the peer and a receive from it in one group): each side's first message carries
// what its receive expects, and the other side settles its send from that reply. Rank 0 always exchanges; rank 1
// answers in every shape, so that the reply names this send, names none (a group without a receive, blocking
// calls) or comes before or after the receive; every message arrives, none completes early or hangs.
TEST(MailboxOrder, ExchangesAgainstEveryShapeOfReply) {
  const int rounds = 240;
  for (Transport tr : {Transport::kP2p, Transport::kShm}) {
    auto errors = runRanks(
        2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          for (int i = 0; i < rounds; ++i) {
            const size_t n = 1 + i % 5;  // sizes vary: every reply names another signature
            std::vector<int32_t> out(n), in(n, -1);
            for (size_t j = 0; j < n; ++j) out[j] = r * 100000 + i * 10 + static_cast<int32_t>(j);
            const int peer = 1 - r;
            const int shape = r == 0 ? 0 : i % 5;
            switch (shape) {
              case 0:  // send first, then receive, one group
              case 1:  // receive first, then send, one group
                groupStart();
                if (shape == 1) c.recv(in.data(), n, DataType::kInt32, peer);
                c.send(out.data(), n, DataType::kInt32, peer);
                if (shape == 0) c.recv(in.data(), n, DataType::kInt32, peer);
                groupEnd();
                break;
              case 2:  // blocking calls: the reply carries no post
                c.send(out.data(), n, DataType::kInt32, peer);
                c.recv(in.data(), n, DataType::kInt32, peer);
                break;
              case 3:  // a group of one send, then a group of one receive
                groupStart();
                c.send(out.data(), n, DataType::kInt32, peer);
                groupEnd();
                groupStart();
                c.recv(in.data(), n, DataType::kInt32, peer);
                groupEnd();
                break;
              default:  // the receive posted asynchronously before the send
              {
                Request q = c.irecv(in.data(), n, DataType::kInt32, peer);
                c.send(out.data(), n, DataType::kInt32, peer);
                q.wait();
              }
            }
            for (size_t j = 0; j < n; ++j)
              check(in[j] == peer * 100000 + i * 10 + static_cast<int32_t>(j),
                    fmt::format("round {} (shape {}): element {} is {}", i, shape, j, in[j]));
          }
        });
    expectNoErrors(errors);
  }
}

// A group of more sends to a peer than the mailbox has slots, with a receive from that peer, against a peer whose
// group only receives them and which sends afterwards: the window of sends must keep moving on verdicts (the
// receive it is grouped with can only finish after the peer's group ended), or both ranks wait for each other.
TEST(MailboxOrder, AWindowOfSendsBesideAReceiveFromALaterSender) {
  const int m = transport::kShotSlots + 40;
  for (Transport tr : {Transport::kP2p, Transport::kShm}) {
    auto errors = runRanks(
        2,
        [tr](int r, InitOptions& o) {
          force(tr, r, o.cfg);
          o.cfg.timeoutSec = 20;
        },
        [&](Communicator& c, int r) {
          std::vector<int32_t> buf(m, -1);
          int32_t back = -1;
          if (r == 0) {
            for (int i = 0; i < m; ++i) buf[i] = 7 * i;
            groupStart();
            for (int i = 0; i < m; ++i) c.send(&buf[i], 1, DataType::kInt32, 1);
            c.recv(&back, 1, DataType::kInt32, 1);
            groupEnd();
            check(back == 4242, "rank 1's message after its group");
          } else {
            groupStart();
            for (int i = 0; i < m; ++i) c.recv(&buf[i], 1, DataType::kInt32, 0);
            groupEnd();
            for (int i = 0; i < m; ++i) check(buf[i] == 7 * i, fmt::format("message {} is {}", i, buf[i]));
            back = 4242;
            c.send(&back, 1, DataType::kInt32, 0);
          }
        });
    expectNoErrors(errors);
  }
}

// A grouped exchange whose receive times out while its send was taken (the peer received it, then was slow to reply):
// only the receive fails; the send, which waited for the reply, learns in a last look that it was taken. The late
// reply is skipped by the next receive.
TEST(MailboxFaults, AnExchangeWhoseReceiveTimesOutKeepsItsTakenSend) {
  for (Transport tr : {Transport::kP2p, Transport::kShm}) {
    std::atomic<bool> failed{false};
    std::string seen;
    auto errors = runRanks(
        2,
        [tr](int r, InitOptions& o) {
          force(tr, r, o.cfg);
          o.cfg.timeoutSec = r == 0 ? 0.5 : 20;
        },
        [&](Communicator& c, int r) {
          int32_t x = 5, y = -1, z = -1;
          if (r == 0) {
            seen = testing::groupError(
                [&] {
                  c.send(&x, 1, DataType::kInt32, 1);
                  c.recv(&y, 1, DataType::kInt32, 1);
                },
                StatusCode::kTimeout);
            failed = true;
            c.recv(&z, 1, DataType::kInt32, 1);  // skips the late reply (y), takes z
            check(z == 77, fmt::format("the message after the late one is {}", z));
          } else {
            c.recv(&x, 1, DataType::kInt32, 0);
            check(x == 5, "rank 0's message");
            while (!failed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            y = 66;
            z = 77;
            c.send(&y, 1, DataType::kInt32, 0);
            c.send(&z, 1, DataType::kInt32, 0);
          }
        });
    expectNoErrors(errors);
    EXPECT_NE(seen.find("recv of 1 x int32 from rank 1"), std::string::npos) << seen;
    EXPECT_EQ(seen.find("send of"), std::string::npos) << seen;
  }
}

// A size mismatch inside a grouped exchange: the reply names what the receive expects, which is not this send, so
// the send learns its verdict (refused) as any send does: both the send and the receive fail, naming both sides;
// the other direction's message arrives, and the next exchange works.
TEST(MailboxFaults, MismatchInsideAnExchangeFailsBothSides) {
  for (Transport tr : {Transport::kP2p, Transport::kShm}) {
    std::vector<std::vector<std::string>> seen(2);
    auto errors = runRanks(
        2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          for (int i = 0; i < 6; ++i) {
            const bool bad = i % 2 == 1;
            std::array<int32_t, 4> out{r + 10, i, 0, 0}, in{-1, -1, -1, -1};
            const size_t recvCount = bad && r == 1 ? 3 : 2;  // rank 1 expects 3 where rank 0 sends 2
            seen[r].push_back(testing::groupError(
                [&] {
                  c.send(out.data(), 2, DataType::kInt32, 1 - r);
                  c.recv(in.data(), recvCount, DataType::kInt32, 1 - r);
                },
                StatusCode::kInvalidUsage));
            if (r == 0) check(in[0] == 11 && in[1] == i, fmt::format("exchange {}: rank 1's message", i));
            if (r == 1 && !bad) check(in[0] == 10 && in[1] == i, fmt::format("exchange {}: rank 0's message", i));
          }
        });
    expectNoErrors(errors);
    for (int i = 0; i < 6; ++i) {
      if (i % 2 == 0) {
        EXPECT_EQ(seen[0][i], "no error");
        EXPECT_EQ(seen[1][i], "no error");
        continue;
      }
      EXPECT_NE(seen[0][i].find("send of 2 x int32 to rank 1"), std::string::npos) << seen[0][i];
      EXPECT_NE(seen[0][i].find("mismatch"), std::string::npos) << seen[0][i];
      EXPECT_NE(seen[1][i].find("recv of 3 x int32 from rank 0"), std::string::npos) << seen[1][i];
      EXPECT_NE(seen[1][i].find("mismatch"), std::string::npos) << seen[1][i];
    }
  }
}

// A communicator destroyed while this thread's group holds its messages and a collective: the group forgets them
// (their requests fail, kAborted) and groupEnd() says so (kInvalidUsage) instead of running them on a dead object.
TEST(MailboxFaults, CommunicatorDestroyedInsideAnOpenGroup) {
  auto comms = testing::initLocalComms(2);
  int32_t a = 7, b = 0;
  std::vector<float> x(16, 1.0f), y(16, 0.0f);
  groupStart();
  comms[0]->send(&a, 1, DataType::kInt32, 1);  // a record (mailbox size)
  Request async = comms[0]->irecv(&b, 1, DataType::kInt32, 1);
  Request coll = comms[0]->iallReduce(x.data(), y.data(), x.size(), DataType::kFloat32, RedOp::kSum);
  comms[0].reset();
  try {
    groupEnd();
    ADD_FAILURE() << "groupEnd() ran a group whose communicator was destroyed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 operation(s) of a communicator destroyed inside the open group"),
              std::string::npos)
        << e.what();
  }
  for (Request* q : {&async, &coll}) {
    try {
      q->wait();
      ADD_FAILURE() << "a dropped request completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kAborted) << e.what();
    }
  }
  EXPECT_EQ(groupDepth(), 0);
  comms[1].reset();
}

// A small receive times out naming the peer; the message that comes late is skipped by the next receive, which
// gets its own. An abort from another thread ends a small receive (and a group of them).
TEST(MailboxFaults, TimeoutLateMessageAndAbort) {
  std::atomic<int> phase{0};
  auto errors = runRanks(
      2,
      [](int r, InitOptions& o) {
        force(Transport::kShm, r, o.cfg);
        o.cfg.timeoutSec = 0.3;
      },
      [&](Communicator& c, int r) {
        c.connectAll();
        int32_t v = 0;
        if (r == 0) {
          try {
            c.recv(&v, 1, DataType::kInt32, 1);
            ADD_FAILURE() << "the receive completed";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), StatusCode::kTimeout) << e.what();
            EXPECT_NE(std::string(e.what()).find("rank 0: recv of 1 x int32 from rank 1"), std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("rank 1 did not move"), std::string::npos) << e.what();
          }
          phase = 1;
          while (phase.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          c.recv(&v, 1, DataType::kInt32, 1);  // skips the late message, takes the next one
          EXPECT_EQ(v, 2);
          std::thread killer([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            c.abort();
          });
          try {
            groupStart();
            c.recv(&v, 1, DataType::kInt32, 1);
            c.recv(&v, 1, DataType::kInt32, 1);
            groupEnd();
            ADD_FAILURE() << "the receives completed";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), StatusCode::kAborted) << e.what();
          }
          killer.join();
          phase = 3;
          return;
        }
        while (phase.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        v = 1;
        // The receiver gave up on this one: the send itself waits for a verdict that comes with the next receive.
        Request late = c.isend(&v, 1, DataType::kInt32, 0);
        int32_t w = 2;
        Request next = c.isend(&w, 1, DataType::kInt32, 0);
        phase = 2;
        late.wait();
        next.wait();
        while (phase.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      });
  expectNoErrors(errors);
}

}  // namespace
}  // namespace topocoll::runtime
