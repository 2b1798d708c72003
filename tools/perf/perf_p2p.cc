// Point-to-point tests of topocoll-perf, over runtime::Communicator's send/recv (the transports): sendrecv_perf
// (nccl-tests' src/sendrecv.cu: each rank sends to rank+1 and receives from rank-1 in one group; busbw = algbw),
// pingpong_perf (ranks 0 and 1, osu_latency: time = round trip / 2) and bw_perf (ranks 0 -> 1, osu_bw: a window of -W
// messages per op, time per message). Out of place only.
#include "perf.h"
#include "topocoll/runtime/communicator.h"

namespace topocoll::perf {
namespace {

Layout whole(size_t count, size_t, int, bool) { return {count, count, count, 0, 0}; }
double one(int) { return 1; }

const std::vector<Test> kTests = {
    {"sendrecv_perf", 1, false, false, false, whole, 1, one, one,
     [](int me, size_t j, const Layout&, int n, int) {
       return Source{(me - 1 + n) % n, j};
     },
     [](World& w, const Options&, const Call& c) {
       int n = w.nRanks, me = w.rank;
       runtime::groupStart();
       w.cxx->send(c.send, c.count, c.type, (me + 1) % n);
       w.cxx->recv(c.recv, c.count, c.type, (me - 1 + n) % n);
       runtime::groupEnd();
     },
     false},
    {"pingpong_perf", 2, false, false, false, whole, 2, one, one,
     [](int me, size_t j, const Layout&, int, int) {
       return Source{me > 1 ? Source::kUnchecked : 1 - me, j};
     },
     [](World& w, const Options&, const Call& c) {
       if (w.rank == 0) {
         w.cxx->send(c.send, c.count, c.type, 1);
         w.cxx->recv(c.recv, c.count, c.type, 1);
       } else if (w.rank == 1) {
         w.cxx->recv(c.recv, c.count, c.type, 0);
         w.cxx->send(c.send, c.count, c.type, 0);
       }
     },
     false},
    {"bw_perf", 2, false, false, false, whole, 0, one, one,
     [](int me, size_t j, const Layout&, int, int) {
       return Source{me == 1 ? 0 : Source::kUnchecked, j};
     },
     [](World& w, const Options& o, const Call& c) {
       int me = w.rank;
       int32_t ack = 0;
       runtime::groupStart();
       for (int i = 0; i < o.window && me < 2; ++i) {
         if (me == 0)
           w.cxx->send(c.send, c.count, c.type, 1);
         else
           w.cxx->recv(c.recv, c.count, c.type, 0);
       }
       runtime::groupEnd();
       if (me == 0) w.cxx->recv(&ack, 1, DataType::kInt32, 1);
       if (me == 1) w.cxx->send(&ack, 1, DataType::kInt32, 0);
     },
     false},
};

}  // namespace

const std::vector<Test>& p2pTests() { return kTests; }

}  // namespace topocoll::perf
