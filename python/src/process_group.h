// topocoll as a torch.distributed backend (PyTorch 1.13's c10d::ProcessGroup) for CPU tensors, on top of topocoll's
// C API. Every call returns an asynchronous Work; operations run in issue order, one at a time per Worker: on the
// thread that waits for them (a blocking call costs no thread hand-off) or on the Worker's thread (collectives and
// receives on one, sends on another, so that an isend/irecv exchange never deadlocks).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "topocoll/topocoll.h"

namespace topocoll::torch_backend {

class ProcessGroupTopocoll : public c10d::ProcessGroup {
 public:
  /// Exchanges topocoll's unique id through `store` (rank 0 creates it, as ProcessGroupNCCL does with NCCL's) and
  /// initialises the communicator. Collective over the group.
  ProcessGroupTopocoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout);
  ~ProcessGroupTopocoll() override;

  /// The function torch.distributed.Backend.register_backend calls: (store, rank, size, timeout).
  static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                      int size, const std::chrono::duration<float>& timeout);

  const std::string getBackendName() const override { return "topocoll"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  /// Gloo's allgather_coalesced: every rank's list of tensors into outputs[rank] (one allgather of the flattened
  /// list).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  /// Gloo's monitoredBarrier, over the store: rank 0 waits for every other rank's arrival within opts.timeout (the
  /// group's when unset) and raises naming the first rank that did not come (every such rank with waitAllRanks);
  /// the others raise when rank 0 does not release them within the timeout.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  /// Rank 0 draws the group's sequence number and hands it to the others through the store (as Gloo); every
  /// collective then counts one.
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  /// Profiler events named "<name>:<op>": "topocoll" (the default) or "gloo" (a suite that believes it runs Gloo).
  void setProfilingName(const std::string& name);
  /// The topocoll communicator (for tests and tools).
  tcclComm_t comm() const { return comm_; }

 private:
  class Worker;
  class Task;
  struct Mailbox;

  // Queues `fn` on `worker` and returns the Work that completes when it has run (fn's outputs become the Work's
  // result and its future's value).
  c10::intrusive_ptr<c10d::Work> sparseAllreduce(at::Tensor& tensor, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> enqueue(Worker& worker, c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<void()> fn, const std::vector<at::Tensor>* inputs = nullptr);
  void check(tcclResult_t rc, const char* what) const;
  void recvTagged(at::Tensor& tensor, int src, int tag);
  int recvAnyTagged(at::Tensor& tensor, int tag);  // returns the sender
  bool takePayload(at::Tensor& tensor, int src, int tag, int64_t msgTag, uint64_t bytes);
  void deliverParked(at::Tensor& tensor, int src, int tag, const std::vector<char>& payload);
  // The collectives' staging buffer: shareable memory (tcclMemAlloc, which the peers map) kept between calls and
  // grown to the largest operation that used it. The list forms stage the tensors that are not consecutive pieces
  // of one buffer in it, and stageFor() the large private tensors of an all-reduce. Only the collectives' Worker
  // touches it, one operation at a time.
  char* staging(size_t bytes);
  // Where an all-reduce of `bytes` bytes of private tensor `t` (not shareable memory: PyTorch's own allocator, which
  // the peers cannot map) runs instead: the staging buffer when TOPOCOLL_TORCH_STAGING allows that size, the group
  // has peers, all on this host, and the buffer may grow that large (kStageMax); nullptr: on the tensor itself.
  // (Staging measured slower than the FIFOs for reduce and reduce-scatter, which have no all-gather phase to gain
  // from mapping.)
  char* stageFor(const at::Tensor& t, size_t bytes);
  // The inputs of a list form as one buffer: the tensors themselves when consecutive, else copied into staging().
  const void* gatherInputs(const std::vector<at::Tensor>& ins);

  tcclComm_t comm_ = nullptr;
  bool glooEvents_ = false;  // profiler events "gloo:<op>" (setProfilingName)
  c10::intrusive_ptr<c10d::Store> store_;
  uint64_t monitoredBarriers_ = 0;  // monitoredBarrier calls so far (their store keys)
  uint64_t timedBarriers_ = 0;      // barriers with a timeout of their own so far (their store keys)
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Worker> collWorker_, sendWorker_;
  std::unique_ptr<Mailbox> mailbox_;
  void* staging_ = nullptr;  // tcclMemAlloc'd
  size_t stagingBytes_ = 0;
  long long stageMin_ = -1;  // TOPOCOLL_TORCH_STAGING
  bool oneHost_ = true;      // every rank on this host: staging pays (the peers map the buffer)
};

}  // namespace topocoll::torch_backend
