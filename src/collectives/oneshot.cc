// The one-shot algorithm of small collectives on one host (docs/collectives.md, "Algorithms", OneShot): every message
// a rank sends in the collective goes at once into the receiving peer's mailbox (progress/mailboxes.h), every rank
// waits for the messages it expects and finishes locally, reducing in rank order. One trip through shared memory
// instead of the ring's 2(n-1) steps, and no engine, no ops, no queue: what the caller's thread does is a few stores,
// a few loads and the reduction.
#include <cstring>

#include "topocoll/collectives/algorithms.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/progress/mailboxes.h"
#include "topocoll/status.h"

namespace topocoll::collectives {

using progress::Mailboxes;

namespace {


// What a rank called, in 32 bits: the receiver compares it with its own (with the size, in the header). Bits 16-31
// number the communicator's one-shot calls (Mailboxes::kCallShift).
uint32_t signature(const Args& a, uint32_t call) {
  uint32_t s = static_cast<uint32_t>(a.coll) | static_cast<uint32_t>(a.type) << 3;
  if (reduces(a.coll)) s |= (static_cast<uint32_t>(a.op) + 1) << 8;
  if (rooted(a.coll)) s |= (static_cast<uint32_t>(a.root) + 1) << 12;
  return s | call << Mailboxes::kCallShift;
}

std::string describe(uint32_t sig, size_t bytes) {
  auto coll = static_cast<Coll>(sig & 7);
  auto type = static_cast<DataType>((sig >> 3) & 31);
  std::string s = fmt::format("{} with {} bytes per peer of {}", collName(coll), bytes,
                              isValid(type) ? to_string(type) : "?");
  if ((sig >> 8) & 15) s += fmt::format(", {}", to_string(static_cast<RedOp>(((sig >> 8) & 15) - 1)));
  if ((sig >> 12) & 15) s += fmt::format(", root {}", ((sig >> 12) & 15) - 1);
  return s;
}

}  // namespace

bool runOneShot(Links& links, const Args& a) {
  Mailboxes* mb = links.mailboxes();
  if (!mb || !mb->ready()) return false;
  const int n = links.nRanks(), me = links.rank();
  const size_t es = sizeOf(a.type), count = a.count, bytes = count * es;
  if (n > Mailboxes::kMaxRanks || bytes > Mailboxes::kMaxBytes)
    fail(StatusCode::kInternal, "the one-shot path holds {} ranks of {} bytes, not {} of {}", Mailboxes::kMaxRanks,
         Mailboxes::kMaxBytes, n, bytes);
  const auto* in = static_cast<const char*>(a.send);
  auto* out = static_cast<char*>(a.recv);
  // Every rank's contribution (reductions), in rank order: srcs[q] points into `got` or at this rank's input.
  alignas(64) char got[Mailboxes::kMaxRanks][Mailboxes::kMaxBytes];
  const void* srcs[Mailboxes::kMaxRanks];
  auto sendData = [&](int q) -> const char* {
    return a.coll == Coll::kReduceScatter ? in + static_cast<size_t>(q) * bytes : in;
  };

  // Who sends to whom, and what.
  Mailboxes::Exchange x;
  x.sig = signature(a, mb->nextCall());
  x.bytes = bytes;
  x.describe = describe;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const bool sends = !(a.coll == Coll::kBroadcast && me != a.root) && !(a.coll == Coll::kReduce && q != a.root);
    const bool recvs = !(a.coll == Coll::kBroadcast && q != a.root) && !(a.coll == Coll::kReduce && me != a.root);
    if (sends) x.toSend |= 1u << q, x.send[q] = sendData(q);
    if (recvs) {
      x.toRecv |= 1u << q;
      x.recv[q] = a.coll == Coll::kAllGather ? out + static_cast<size_t>(q) * bytes
                  : a.coll == Coll::kBroadcast ? out
                                               : got[q];
    }
  }
  mb->exchange(x);

  // Every message arrived: finish locally, in rank order (every rank computes the same bits; the Direct algorithm's
  // order, so the results are those of Direct).
  switch (a.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kReduceScatter: {
      if (a.coll == Coll::kReduce && me != a.root) return true;
      const char* mine = sendData(me);
      for (int q = 0; q < n; ++q) srcs[q] = q == me ? static_cast<const void*>(mine) : got[q];
      // dst may alias only srcs[0], and only exactly: reduce into a scratch line when the output overlaps this rank's
      // input otherwise (a later source, or rank 0's input shifted).
      const bool alias = (me != 0 || out != mine) && out < mine + bytes && mine < out + bytes;
      char* dst = alias ? got[me] : out;
      reduceMany(a.type, a.op, dst, srcs, n, count);
      if (alias) std::memcpy(out, dst, bytes);
      if (a.op == RedOp::kAvg) finishAvg(a.type, out, count, n);
      return true;
    }
    case Coll::kAllGather:
      if (out + static_cast<size_t>(me) * bytes != in) std::memmove(out + static_cast<size_t>(me) * bytes, in, bytes);
      return true;
    case Coll::kBroadcast:
      if (me == a.root && out != in) std::memmove(out, in, bytes);
      return true;
  }
  return true;
}

}  // namespace topocoll::collectives
