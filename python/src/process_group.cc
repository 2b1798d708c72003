#include "process_group.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <stdexcept>

namespace topocoll::torch_backend {

namespace {

constexpr const char* kUniqueIdKey = "topocoll_unique_id";

// PyTorch dtype -> topocoll type; types topocoll lacks (bool, complex) are refused with the dtype's name.
tcclDataType_t toTccl(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar: return tcclInt8;
    case at::kByte: return tcclUint8;
    case at::kInt: return tcclInt32;
    case at::kLong: return tcclInt64;
    case at::kHalf: return tcclFloat16;
    case at::kFloat: return tcclFloat32;
    case at::kDouble: return tcclFloat64;
    case at::kBFloat16: return tcclBfloat16;
    default:
      TORCH_CHECK(false, "ProcessGroupTopocoll does not support tensors of dtype ", t.scalar_type(),
                  " (supported: int8, uint8, int32, int64, float16, bfloat16, float32, float64)");
  }
}

tcclRedOp_t toTccl(const c10d::ReduceOp& op, const at::Tensor& t) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return tcclSum;
    case c10d::ReduceOp::PRODUCT: return tcclProd;
    case c10d::ReduceOp::MIN: return tcclMin;
    case c10d::ReduceOp::MAX: return tcclMax;
    case c10d::ReduceOp::AVG: return tcclAvg;
    default:
      TORCH_CHECK(false, "ProcessGroupTopocoll does not support ReduceOp ", static_cast<int>(op.op_),
                  " (BAND, BOR, BXOR and PREMUL_SUM are not topocoll operations; use SUM, PRODUCT, MIN, MAX or AVG)");
  }
}

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "ProcessGroupTopocoll: ", what, " is on ", t.device(),
              "; only CPU tensors are supported by this build");
  TORCH_CHECK(t.is_contiguous(), "ProcessGroupTopocoll: ", what, " must be contiguous (call .contiguous())");
  TORCH_CHECK(!t.is_sparse(), "ProcessGroupTopocoll: ", what, " is sparse; only dense tensors are supported");
}

void checkSingle(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "ProcessGroupTopocoll::", op, " takes one tensor per process, got ", ts.size());
  checkTensor(ts[0], "the tensor");
  toTccl(ts[0]);
}

void checkSameLayout(const at::Tensor& ref, const at::Tensor& t, const char* what) {
  checkTensor(t, what);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "ProcessGroupTopocoll: ", what, " has dtype ", t.scalar_type(),
              " but the input has ", ref.scalar_type(), "; every tensor of an operation must have the same dtype");
  TORCH_CHECK(t.numel() == ref.numel(), "ProcessGroupTopocoll: ", what, " has ", t.numel(),
              " elements but the input has ", ref.numel());
}

}  // namespace

// A thread running queued operations in order.
class ProcessGroupTopocoll::Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Messages that arrived for a tag nobody asked for yet (PyTorch matches send/recv by (peer, tag)).
struct ProcessGroupTopocoll::Mailbox {
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> pending;  // (src, tag) -> payloads in arrival order
};

namespace {

// A Work completed by a worker thread; its future carries the output tensors.
class TopocollWork : public c10d::Work {
 public:
  TopocollWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(rank, type), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  void complete(std::exception_ptr error) {
    finish(error);
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

struct Header {
  int64_t tag;
  uint64_t bytes;
};

}  // namespace

ProcessGroupTopocoll::ProcessGroupTopocoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                           std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size), timeout_(timeout), mailbox_(std::make_unique<Mailbox>()) {
  tcclUniqueId id;
  if (rank == 0) {
    check(tcclGetUniqueId(&id), "tcclGetUniqueId");
    store->set(kUniqueIdKey, std::vector<uint8_t>(id.internal, id.internal + TCCL_UNIQUE_ID_BYTES));
  } else {
    store->wait({kUniqueIdKey}, timeout);
    auto bytes = store->get(kUniqueIdKey);
    TORCH_CHECK(bytes.size() == TCCL_UNIQUE_ID_BYTES, "ProcessGroupTopocoll: the store holds a unique id of ",
                bytes.size(), " bytes, ", TCCL_UNIQUE_ID_BYTES, " expected");
    std::memcpy(id.internal, bytes.data(), TCCL_UNIQUE_ID_BYTES);
  }
  check(tcclCommInitRank(&comm_, size, id, rank), "tcclCommInitRank");
  collWorker_ = std::make_unique<Worker>();
  sendWorker_ = std::make_unique<Worker>();
}

ProcessGroupTopocoll::~ProcessGroupTopocoll() {
  collWorker_.reset();  // drains what was queued
  sendWorker_.reset();
  tcclCommDestroy(comm_);
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupTopocoll::create(const c10::intrusive_ptr<c10d::Store>& store,
                                                                   int rank, int size,
                                                                   const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<ProcessGroupTopocoll>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

void ProcessGroupTopocoll::check(tcclResult_t rc, const char* what) const {
  if (rc == tcclSuccess) return;
  const char* detail = tcclGetLastError(comm_);
  TORCH_CHECK(false, "topocoll ", what, " failed: ", tcclGetErrorString(rc), ": ",
              detail && detail[0] ? detail : tcclGetLastError(nullptr));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::enqueue(Worker& worker, c10d::OpType type,
                                                            std::vector<at::Tensor> outputs,
                                                            std::function<void()> fn) {
  auto work = c10::make_intrusive<TopocollWork>(getRank(), type, std::move(outputs));
  worker.push([work, fn = std::move(fn)] {
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  checkSingle(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "ProcessGroupTopocoll::broadcast: root ",
              opts.rootRank, " out of range");
  at::Tensor t = tensors[0];
  return enqueue(*collWorker_, c10d::OpType::BROADCAST, tensors, [this, t, root = opts.rootRank]() {
    check(tcclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), toTccl(t), root, comm_, nullptr), "tcclBroadcast");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  checkSingle(tensors, "allreduce");
  at::Tensor t = tensors[0];
  tcclRedOp_t op = toTccl(opts.reduceOp, t);
  return enqueue(*collWorker_, c10d::OpType::ALLREDUCE, tensors, [this, t, op]() {
    check(tcclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), toTccl(t), op, comm_, nullptr), "tcclAllReduce");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "ProcessGroupTopocoll::allreduce_coalesced: no tensors");
  for (auto& t : tensors) {
    checkTensor(t, "a coalesced tensor");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "ProcessGroupTopocoll::allreduce_coalesced: every tensor must have the same dtype");
  }
  tcclRedOp_t op = toTccl(opts.reduceOp, tensors[0]);
  std::vector<at::Tensor> ts = tensors;
  return enqueue(*collWorker_, c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, ts, op]() {
    check(tcclGroupStart(), "tcclGroupStart");
    for (auto& t : ts) tcclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), toTccl(t), op, comm_, nullptr);
    check(tcclGroupEnd(), "tcclAllReduce (coalesced)");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  checkSingle(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "ProcessGroupTopocoll::reduce: root ", opts.rootRank,
              " out of range");
  at::Tensor t = tensors[0];
  tcclRedOp_t op = toTccl(opts.reduceOp, t);
  return enqueue(*collWorker_, c10d::OpType::REDUCE, tensors, [this, t, op, root = opts.rootRank]() {
    check(tcclReduce(t.data_ptr(), t.data_ptr(), t.numel(), toTccl(t), op, root, comm_, nullptr), "tcclReduce");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions& opts) {
  checkSingle(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "ProcessGroupTopocoll::allgather: expects one list of ", getSize(), " output tensors");
  for (auto& o : outputs[0]) checkSameLayout(inputs[0], o, "an output tensor");
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(*collWorker_, c10d::OpType::ALLGATHER, outs, [this, in, outs]() {
    at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()) * in.numel()}, in.options());
    check(tcclAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), toTccl(in), comm_, nullptr), "tcclAllGather");
    for (size_t r = 0; r < outs.size(); ++r) outs[r].view(-1).copy_(flat.narrow(0, r * in.numel(), in.numel()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions& opts) {
  checkTensor(input, "the input");
  checkTensor(output, "the output");
  toTccl(input);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ProcessGroupTopocoll::_allgather_base: dtypes differ");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "ProcessGroupTopocoll::_allgather_base: the output has ",
              output.numel(), " elements, ", input.numel() * getSize(), " expected (input x world size)");
  at::Tensor in = input, out = output;
  return enqueue(*collWorker_, c10d::OpType::_ALLGATHER_BASE, {output}, [this, in, out]() {
    check(tcclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), toTccl(in), comm_, nullptr), "tcclAllGather");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::GatherOptions& opts) {
  checkSingle(inputs, "gather");
  int root = opts.rootRank;
  TORCH_CHECK(root >= 0 && root < getSize(), "ProcessGroupTopocoll::gather: root ", root, " out of range");
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "ProcessGroupTopocoll::gather: the root expects one list of ", getSize(), " output tensors");
    for (auto& o : outputs[0]) checkSameLayout(inputs[0], o, "an output tensor");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "ProcessGroupTopocoll::gather: only the root takes outputs");
  }
  at::Tensor in = inputs[0];
  return enqueue(*collWorker_, c10d::OpType::GATHER, outs, [this, in, outs, root]() {
    at::Tensor flat = at::empty({getRank() == root ? getSize() * in.numel() : 0}, in.options());
    check(tcclGather(in.data_ptr(), flat.data_ptr(), in.numel(), toTccl(in), root, comm_, nullptr), "tcclGather");
    for (size_t r = 0; r < outs.size(); ++r) outs[r].view(-1).copy_(flat.narrow(0, r * in.numel(), in.numel()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  checkSingle(outputs, "scatter");
  int root = opts.rootRank;
  TORCH_CHECK(root >= 0 && root < getSize(), "ProcessGroupTopocoll::scatter: root ", root, " out of range");
  at::Tensor flat;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "ProcessGroupTopocoll::scatter: the root expects one list of ", getSize(), " input tensors");
    for (auto& i : inputs[0]) checkSameLayout(outputs[0], i, "an input tensor");
    std::vector<at::Tensor> flats;
    for (auto& i : inputs[0]) flats.push_back(i.reshape(-1));
    flat = at::cat(flats);
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "ProcessGroupTopocoll::scatter: only the root takes inputs");
    flat = at::empty({0}, outputs[0].options());
  }
  at::Tensor out = outputs[0];
  return enqueue(*collWorker_, c10d::OpType::SCATTER, outputs, [this, flat, out, root]() {
    check(tcclScatter(flat.data_ptr(), out.data_ptr(), out.numel(), toTccl(out), root, comm_, nullptr), "tcclScatter");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  checkSingle(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "ProcessGroupTopocoll::reduce_scatter: expects one list of ", getSize(), " input tensors");
  for (auto& i : inputs[0]) checkSameLayout(outputs[0], i, "an input tensor");
  std::vector<at::Tensor> flats;
  for (auto& i : inputs[0]) flats.push_back(i.reshape(-1));
  at::Tensor flat = at::cat(flats), out = outputs[0];
  tcclRedOp_t op = toTccl(opts.reduceOp, out);
  return enqueue(*collWorker_, c10d::OpType::REDUCE_SCATTER, outputs, [this, flat, out, op]() {
    check(tcclReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), toTccl(out), op, comm_, nullptr),
          "tcclReduceScatter");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "the input");
  checkTensor(output, "the output");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ProcessGroupTopocoll::_reduce_scatter_base: dtypes differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "ProcessGroupTopocoll::_reduce_scatter_base: the input has ",
              input.numel(), " elements, ", output.numel() * getSize(), " expected (output x world size)");
  at::Tensor in = input, out = output;
  tcclRedOp_t op = toTccl(opts.reduceOp, out);
  return enqueue(*collWorker_, c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [this, in, out, op]() {
    check(tcclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), toTccl(out), op, comm_, nullptr),
          "tcclReduceScatter");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<int64_t>& outputSplits,
                                                                  std::vector<int64_t>& inputSplits,
                                                                  const c10d::AllToAllOptions& opts) {
  checkTensor(input, "the input");
  checkTensor(output, "the output");
  toTccl(input);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ProcessGroupTopocoll::alltoall_base: dtypes differ");
  int n = getSize();
  int64_t rowIn = input.dim() ? input.numel() / std::max<int64_t>(input.size(0), 1) : 1;
  int64_t rowOut = output.dim() ? output.numel() / std::max<int64_t>(output.size(0), 1) : 1;
  auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, int64_t row, const char* what) {
    std::vector<int64_t> c(n);
    if (splits.empty()) {
      TORCH_CHECK(t.dim() > 0 && t.size(0) % n == 0, "ProcessGroupTopocoll::alltoall_base: the ", what,
                  "'s first dimension must divide evenly by the world size ", n);
      for (auto& x : c) x = t.size(0) / n * row;
    } else {
      TORCH_CHECK(static_cast<int>(splits.size()) == n, "ProcessGroupTopocoll::alltoall_base: ", what, " splits have ",
                  splits.size(), " entries, world size is ", n);
      int64_t sum = 0;
      for (int i = 0; i < n; ++i) {
        TORCH_CHECK(splits[i] >= 0, "ProcessGroupTopocoll::alltoall_base: negative split");
        c[i] = splits[i] * row;
        sum += splits[i];
      }
      TORCH_CHECK(sum == (t.dim() ? t.size(0) : 0), "ProcessGroupTopocoll::alltoall_base: ", what,
                  " splits add up to ", sum, " rows, the tensor has ", t.dim() ? t.size(0) : 0);
    }
    return c;
  };
  std::vector<int64_t> sendCounts = counts(inputSplits, input, rowIn, "input");
  std::vector<int64_t> recvCounts = counts(outputSplits, output, rowOut, "output");
  at::Tensor in = input, out = output;
  return enqueue(*collWorker_, c10d::OpType::ALLTOALL_BASE, {output}, [this, in, out, sendCounts, recvCounts]() {
    size_t es = in.element_size();
    tcclDataType_t t = toTccl(in);
    check(tcclGroupStart(), "tcclGroupStart");
    int64_t sOff = 0, rOff = 0;
    for (int p = 0; p < getSize(); ++p) {
      tcclSend(static_cast<char*>(in.data_ptr()) + sOff * es, sendCounts[p], t, p, comm_, nullptr);
      tcclRecv(static_cast<char*>(out.data_ptr()) + rOff * es, recvCounts[p], t, p, comm_, nullptr);
      sOff += sendCounts[p];
      rOff += recvCounts[p];
    }
    check(tcclGroupEnd(), "all-to-all (grouped send/recv)");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  int n = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
              "ProcessGroupTopocoll::alltoall: expects ", n, " input and ", n, " output tensors");
  for (auto& t : inputs) {
    checkTensor(t, "an input tensor");
    toTccl(t);
  }
  for (auto& t : outputs) checkTensor(t, "an output tensor");
  for (int p = 0; p < n; ++p)
    TORCH_CHECK(inputs[p].scalar_type() == inputs[0].scalar_type() && outputs[p].scalar_type() == inputs[0].scalar_type(),
                "ProcessGroupTopocoll::alltoall: every tensor must have the same dtype");
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(*collWorker_, c10d::OpType::ALLTOALL, outputs, [this, ins, outs]() {
    check(tcclGroupStart(), "tcclGroupStart");
    for (int p = 0; p < getSize(); ++p) {
      tcclSend(ins[p].data_ptr(), ins[p].numel(), toTccl(ins[p]), p, comm_, nullptr);
      tcclRecv(outs[p].data_ptr(), outs[p].numel(), toTccl(outs[p]), p, comm_, nullptr);
    }
    check(tcclGroupEnd(), "all-to-all (grouped send/recv)");
  });
}

// Point to point: each message is a header (tag, bytes) then its payload. Sends run in order on a thread of their
// own, receives in order on the operations thread, so that an isend/irecv exchange between two ranks completes. A
// receive takes the peer's messages in arrival order and parks those of other tags until a receive asks for them
// (PyTorch matches by (peer, tag)).
c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  checkSingle(tensors, "send");
  TORCH_CHECK(dstRank >= 0 && dstRank < getSize(), "ProcessGroupTopocoll::send: rank ", dstRank, " out of range");
  at::Tensor t = tensors[0];
  return enqueue(*sendWorker_, c10d::OpType::SEND, tensors, [this, t, dstRank, tag]() {
    Header h{tag, static_cast<uint64_t>(t.numel() * t.element_size())};
    check(tcclSend(&h, sizeof(h), tcclUint8, dstRank, comm_, nullptr), "tcclSend (header)");
    check(tcclSend(t.data_ptr(), h.bytes, tcclUint8, dstRank, comm_, nullptr), "tcclSend");
  });
}

void ProcessGroupTopocoll::recvTagged(at::Tensor& t, int src, int tag) {
  uint64_t want = static_cast<uint64_t>(t.numel() * t.element_size());
  auto deliver = [&](const char* data, uint64_t bytes) {
    TORCH_CHECK(bytes == want, "ProcessGroupTopocoll::recv: rank ", src, " sent ", bytes, " bytes with tag ", tag,
                ", this receive expects ", want);
    std::memcpy(t.data_ptr(), data, bytes);
  };
  auto& box = mailbox_->pending[{src, tag}];
  if (!box.empty()) {
    deliver(box.front().data(), box.front().size());
    box.pop_front();
    return;
  }
  while (true) {
    Header h{};
    check(tcclRecv(&h, sizeof(h), tcclUint8, src, comm_, nullptr), "tcclRecv (header)");
    if (h.tag == tag && h.bytes == want) {
      check(tcclRecv(t.data_ptr(), h.bytes, tcclUint8, src, comm_, nullptr), "tcclRecv");
      return;
    }
    std::vector<char> payload(h.bytes);
    check(tcclRecv(payload.data(), h.bytes, tcclUint8, src, comm_, nullptr), "tcclRecv");
    if (h.tag == tag) return deliver(payload.data(), h.bytes);  // size mismatch: named by deliver
    mailbox_->pending[{src, static_cast<int>(h.tag)}].push_back(std::move(payload));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkSingle(tensors, "recv");
  TORCH_CHECK(srcRank >= 0 && srcRank < getSize(), "ProcessGroupTopocoll::recv: rank ", srcRank, " out of range");
  at::Tensor t = tensors[0];
  return enqueue(*collWorker_, c10d::OpType::RECV, tensors,
                 [this, t, srcRank, tag]() mutable { recvTagged(t, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(*collWorker_, c10d::OpType::BARRIER, {}, [this]() { check(tcclBarrier(comm_, nullptr), "tcclBarrier"); });
}

}  // namespace topocoll::torch_backend
