// libFuzzer target: the C API's argument checks. Every call of the input runs on one rank of a one-rank
// communicator with fuzzed data types, reduction ops, roots, peers, counts, NULL buffers, streams and communicators;
// a call returns a result code (tcclInvalidArgument for what it refuses) and never crashes, hangs or trips a
// sanitizer. Counts are bounded by the harness's buffers: the library cannot know a buffer's size.
//
// Input: records of 16 bytes: [call][flags][count][pad][datatype: 4][op: 4][root or peer: 4]
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "topocoll/topocoll.h"

namespace {

tcclComm_t comm() {
  static tcclComm_t c = [] {
    // A receive whose send was refused, or a send to itself without a receive, fails after 0.2 s instead of hanging:
    // with 1 s, inputs that the fuzzer grows around such groups took most of the stage (10,000 runs: 220 s).
    setenv("TOPOCOLL_TIMEOUT", "0.2", 1);
    tcclComm_t x = nullptr;
    if (tcclCommInitAll(&x, 1, nullptr) != tcclSuccess) std::abort();
    return x;
  }();
  return c;
}

alignas(64) uint8_t sendBuf[1 << 14], recvBuf[1 << 14];

int32_t i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tcclComm_t c = comm();
  for (size_t at = 0; at + 16 <= size; at += 16) {
    const uint8_t* r = data + at;
    const uint8_t flags = r[1];
    const size_t count = r[2];  // <= 255 elements of <= 8 bytes: inside the buffers
    auto dtype = static_cast<tcclDataType_t>(i32(r + 4) % 16);
    auto op = static_cast<tcclRedOp_t>(i32(r + 8) % 8);
    const int who = i32(r + 12) % 4;
    const void* sb = flags & 1 ? nullptr : sendBuf;
    void* rb = flags & 2 ? nullptr : recvBuf;
    if (flags & 4) sb = rb;  // in place
    tcclStream_t stream = flags & 8 ? reinterpret_cast<tcclStream_t>(0x1) : nullptr;
    tcclComm_t cm = flags & 16 ? nullptr : c;
    tcclResult_t rc = tcclSuccess;
    switch (r[0] % 14) {
      case 0: rc = tcclAllReduce(sb, rb, count, dtype, op, cm, stream); break;
      case 1: rc = tcclBroadcast(sb, rb, count, dtype, who, cm, stream); break;
      case 2: rc = tcclReduce(sb, rb, count, dtype, op, who, cm, stream); break;
      case 3: rc = tcclAllGather(sb, rb, count, dtype, cm, stream); break;
      case 4: rc = tcclReduceScatter(sb, rb, count, dtype, op, cm, stream); break;
      case 5: rc = tcclAlltoAll(sb, rb, count, dtype, cm, stream); break;
      case 6: rc = tcclGather(sb, rb, count, dtype, who, cm, stream); break;
      case 7: rc = tcclScatter(sb, rb, count, dtype, who, cm, stream); break;
      case 8: rc = tcclBarrier(cm, stream); break;
      case 9: {  // a send and its receive, issued together; the receive only when the send was accepted
        tcclGroupStart();
        rc = tcclSend(sb, count, dtype, who, cm, stream);
        if (rc == tcclSuccess) tcclRecv(rb, flags & 32 ? count + 1 : count, dtype, who, cm, stream);
        tcclGroupEnd();
        break;
      }
      case 10: {
        int n = -1;
        rc = tcclCommCount(cm, flags & 1 ? nullptr : &n);
        if (rc == tcclSuccess && n != 1) __builtin_trap();
        break;
      }
      case 11: {
        int rank = -1;
        rc = tcclCommUserRank(cm, flags & 1 ? nullptr : &rank);
        if (rc == tcclSuccess && rank != 0) __builtin_trap();
        break;
      }
      case 12:
        if (tcclGetErrorString(static_cast<tcclResult_t>(i32(r + 4))) == nullptr) __builtin_trap();
        break;
      case 13:
        if (tcclGetLastError(cm) == nullptr) __builtin_trap();
        break;
    }
    if (rc < tcclSuccess || rc >= tcclNumResults) __builtin_trap();
    // What the checks must refuse, they refuse.
    if (!cm && r[0] % 14 <= 9 && rc == tcclSuccess) __builtin_trap();
  }
  return 0;
}
