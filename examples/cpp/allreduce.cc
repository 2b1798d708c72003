// topocoll's C++ API: every rank of a job its launcher started joins one communicator and sums a vector.
//   torchrun --no_python --nproc_per_node=2 --redirects 2 --tee 1 ./allreduce
//   mpirun -np 2 ./allreduce
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./allreduce & RANK=1 WORLD_SIZE=2 ... ./allreduce
#include <cstdio>
#include <vector>

#include <topocoll/runtime/communicator.h>

int main() {
  using namespace topocoll;
  try {
    auto comm = runtime::Communicator::initFromEnv(Env::fromProcess());
    const int rank = comm->rank(), n = comm->nRanks();
    std::vector<double> in(1 << 20, rank + 1.0), out(in.size());
    comm->allReduce(in.data(), out.data(), in.size(), DataType::kFloat64, RedOp::kSum);
    const double want = n * (n + 1) / 2.0;
    size_t wrong = 0;
    for (double v : out) wrong += v != want;
    // What the planner chose for this call on this machine (the same choice the runtime made).
    collectives::Args call;
    call.coll = collectives::Coll::kAllReduce;
    call.count = in.size();
    call.type = DataType::kFloat64;
    const collectives::Choice choice = comm->choose(call);
    std::printf("rank %d of %d (%d node(s)): AllReduce of %zu doubles: %s (%s, %s, %d channel(s))\n", rank, n,
                comm->nNodes(), in.size(), wrong ? "WRONG" : "correct", collectives::algoName(choice.algo),
                collectives::protoName(choice.proto), choice.nChannels);
    return wrong ? 1 : 0;
  } catch (const Error& e) {  // every failure names the rank, peer or knob at fault
    std::fprintf(stderr, "allreduce: %s: %s\n", to_string(e.code()), e.what());
    return 1;
  }
}
