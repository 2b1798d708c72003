#include <Python.h>  // first, as Python asks

#include "process_group.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <cstring>
#include <stdexcept>

#include "c_api_internal.h"
#include "cpu_allocator.h"
#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/status.h"
#include "topocoll/transport/peer_memory.h"

namespace topocoll::torch_backend {

namespace {

constexpr const char* kUniqueIdKey = "topocoll_unique_id";
// The staging buffer grows to this many bytes at most for private tensors (stageFor; DDP's 25 MiB buckets fit);
// larger ones run on the tensors: there the two copies cost what mapping saves (docs/pytorch.md).
constexpr size_t kStageMax = size_t(32) << 20;

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
    case at::kBool: return tcclUint8;  // one byte, 0 or 1 (toTccl(op, t) maps the ops)
    default:
      TORCH_CHECK(false, "ProcessGroupTopocoll does not support tensors of dtype ", t.scalar_type(),
                  " (supported: bool, int8, uint8, int32, int64, float16, bfloat16, float32, float64; complex "
                  "tensors reach backends as real views)");
  }
}

// Gloo's bitwise ops (integers and bool): they run as an allgather and a fold here (topocoll has no such op).
bool bitwise(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR || op.op_ == c10d::ReduceOp::BXOR;
}

void checkBitwise(const c10d::ReduceOp& op, const at::Tensor& t) {
  TORCH_CHECK(at::isIntegralType(t.scalar_type(), /*includeBool=*/true), "ProcessGroupTopocoll: cannot use ReduceOp.",
              op.op_ == c10d::ReduceOp::BAND ? "BAND" : op.op_ == c10d::ReduceOp::BOR ? "BOR" : "BXOR",
              " with non-integral dtype ", t.scalar_type());
}

// `all` holds every rank's copy of t (rank r's at row r): their bitwise fold, written into t.
void foldBitwise(const c10d::ReduceOp& op, const at::Tensor& all, at::Tensor& t) {
  at::Tensor acc = all[0].clone();
  for (int64_t r = 1; r < all.size(0); ++r) {
    if (op.op_ == c10d::ReduceOp::BAND)
      acc.bitwise_and_(all[r]);
    else if (op.op_ == c10d::ReduceOp::BOR)
      acc.bitwise_or_(all[r]);
    else
      acc.bitwise_xor_(all[r]);
  }
  t.view({-1}).copy_(acc);
}

tcclRedOp_t toTccl(const c10d::ReduceOp& op, const at::Tensor& t) {
  if (t.scalar_type() == at::kBool) {
    // Gloo's bool: a sum or a max is "any", a product or a min is "all".
    switch (op.op_) {
      case c10d::ReduceOp::SUM:
      case c10d::ReduceOp::MAX: return tcclMax;
      case c10d::ReduceOp::PRODUCT:
      case c10d::ReduceOp::MIN: return tcclMin;
      default: break;
    }
  }
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return tcclSum;
    case c10d::ReduceOp::PRODUCT: return tcclProd;
    case c10d::ReduceOp::MIN: return tcclMin;
    case c10d::ReduceOp::MAX: return tcclMax;
    case c10d::ReduceOp::AVG: return tcclAvg;
    default:
      TORCH_CHECK(false, "ProcessGroupTopocoll does not support ReduceOp ", static_cast<int>(op.op_), " on ",
                  t.scalar_type(), " tensors here (SUM, PRODUCT, MIN, MAX, AVG; BAND, BOR, BXOR on integers and "
                  "bool with all_reduce and reduce)");
  }
}

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "ProcessGroupTopocoll: ", what, " is on ", t.device(),
              "; only CPU tensors are supported by this build");
  TORCH_CHECK(t.is_contiguous(), "ProcessGroupTopocoll: ", what, " must be contiguous (call .contiguous())");
  TORCH_CHECK(!t.is_sparse(), "ProcessGroupTopocoll: ", what, " is sparse; only all_reduce takes sparse tensors");
  noteTensorUse(t.data_ptr(), t.nbytes());  // a large tensor not on huge pages is collapsed onto them once reused
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

// On the operation's thread, before it runs: a tensor that is a whole shareable block a fork() turned private is
// made shareable again (cpu_allocator.h), so that the peers map it rather than copy it with process_vm_readv.
void own(const at::Tensor& t) {
  const auto& st = t.storage();
  reshareWholeBlock(st.data(), st.nbytes(), t.data_ptr(), t.nbytes());
}

size_t bytesOf(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// Whether equally sized tensors are consecutive pieces of one buffer (torch.empty(n * k).chunk(n), ...): a list form
// then runs as its _base form on them, with no staging copy.
// "1, 4, 7": the ranks a barrier names.
std::string joinRanks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

bool consecutive(const std::vector<at::Tensor>& ts) {
  size_t bytes = bytesOf(ts[0]);
  if (bytes == 0) return true;
  auto* base = static_cast<const char*>(ts[0].data_ptr());
  for (size_t i = 1; i < ts.size(); ++i)
    if (static_cast<const char*>(ts[i].data_ptr()) != base + i * bytes) return false;
  return true;
}

// Gloo's event names, for setProfilingName("gloo").
const char* glooTitle(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "gloo:broadcast";
    case c10d::OpType::ALLREDUCE: return "gloo:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "gloo:all_reduce";
    case c10d::OpType::REDUCE: return "gloo:reduce";
    case c10d::OpType::ALLGATHER: return "gloo:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "gloo:all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "gloo:all_gather";
    case c10d::OpType::GATHER: return "gloo:gather";
    case c10d::OpType::SCATTER: return "gloo:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "gloo:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "gloo:reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE: return "gloo:all_to_all_base";
    case c10d::OpType::ALLTOALL: return "gloo:all_to_all";
    case c10d::OpType::SEND: return "gloo:send";
    case c10d::OpType::RECV: return "gloo:recv";
    case c10d::OpType::RECVANYSOURCE: return "gloo:recvAnySource";
    case c10d::OpType::BARRIER: return "gloo:barrier";
    default: return "gloo:op";
  }
}

const char* profilingTitle(c10d::OpType type, bool gloo) {
  if (gloo) return glooTitle(type);
  switch (type) {
    case c10d::OpType::BROADCAST: return "topocoll:broadcast";
    case c10d::OpType::ALLREDUCE: return "topocoll:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "topocoll:all_reduce";
    case c10d::OpType::REDUCE: return "topocoll:reduce";
    case c10d::OpType::ALLGATHER: return "topocoll:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "topocoll:all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "topocoll:all_gather";
    case c10d::OpType::GATHER: return "topocoll:gather";
    case c10d::OpType::SCATTER: return "topocoll:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "topocoll:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "topocoll:reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE: return "topocoll:all_to_all_base";
    case c10d::OpType::ALLTOALL: return "topocoll:all_to_all";
    case c10d::OpType::SEND: return "topocoll:send";
    case c10d::OpType::RECV: return "topocoll:recv";
    case c10d::OpType::RECVANYSOURCE: return "topocoll:recvAnySource";
    case c10d::OpType::BARRIER: return "topocoll:barrier";
    default: return "topocoll:op";
  }
}

}  // namespace

// A Work run by the group's Worker (or by the thread that waits for it); its future carries the output tensors.
class ProcessGroupTopocoll::Task : public c10d::Work {
 public:
  // Queued or running, a Task counts as peer access in flight (transport::notePeerAccess): a fork() meanwhile
  // copies the shareable tensors into the child rather than making the parent's copy-on-write, since a peer may be
  // writing into them.
  // The profiler sees each operation as "topocoll:<op>" with its tensors' shapes, as Gloo's "gloo:<op>" events.
  Task(Worker* worker, int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::function<void()> fn,
       bool glooEvents, const std::vector<at::Tensor>& profiled)
      : Work(rank, type, profilingTitle(type, glooEvents), c10::optional<std::vector<at::Tensor>>(profiled)),
        worker_(worker),
        fn_(std::move(fn)),
        outputs_(std::move(outputs)) {
    transport::notePeerAccess(1);
  }
  ~Task() override {
    if (fn_) transport::notePeerAccess(-1);  // never ran
  }

  // Runs the operation once, on whichever thread claimed it, and completes the Work with its outcome.
  void run() {
    std::exception_ptr error;
    try {
      fn_();
    } catch (...) {
      error = std::current_exception();
    }
    fn_ = nullptr;  // drops the tensors it held
    transport::notePeerAccess(-1);
    c10::intrusive_ptr<at::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> lk(futureMu_);
      error_ = error;
      ran_ = true;
      future = future_;
    }
    finish(error);
    if (future) complete(*future);
  }
  // A waiting caller runs the operation itself when the worker has not started it (and nothing is ahead of it): a
  // blocking dist.all_reduce then costs no thread hand-off. Once complete the Work never touches the worker again
  // (it may outlive the group).
  bool wait(std::chrono::milliseconds timeout) override;
  // Polling a Work (or taking its future) starts it at once if it still waits for its caller.
  bool isCompleted() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive from any rank: its sender, once it ran (Work::source_rank()).
  void setSource(std::shared_ptr<std::atomic<int>> source) { source_ = std::move(source); }
  int sourceRank() const override {
    const int r = source_ ? source_->load(std::memory_order_acquire) : -1;
    return r >= 0 ? r : Work::sourceRank();  // not such a receive, or not run yet: torch's own refusal
  }

 private:
  Worker* worker_;
  std::shared_ptr<std::atomic<int>> source_;
  std::function<void()> fn_;
  std::vector<at::Tensor> outputs_;
  // The future exists once somebody asks for it (most calls never do: it costs allocations per operation).
  void complete(at::ivalue::Future& future) {
    if (error_) future.setError(error_);
    else future.markCompleted(c10::IValue(outputs_));
  }
  std::mutex futureMu_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  std::exception_ptr error_;
  bool ran_ = false;
};

// Runs queued Tasks in issue order, one at a time: on the thread that waits for one of them (help: a blocking
// dist.all_reduce then costs no thread hand-off, no wake-up, no context switch) or on its own thread. A lazy worker
// (collectives and receives) leaves a new Task to its waiter for kStartDelay and starts it itself after that, or at
// once when somebody polls it (is_completed, get_future) or a later Task is queued behind it: an async_op=True call
// nobody waits for still runs (another group's operations may depend on it). While Tasks come in, its thread wakes on
// a timer (kStartDelay) instead of being woken for each one; kArm after the last one it sleeps until the next.
// An eager worker (sends: an isend must progress while its rank waits for the matching irecv) starts each at once.
class ProcessGroupTopocoll::Worker {
 public:
  static constexpr std::chrono::microseconds kStartDelay{1000};
  static constexpr std::chrono::milliseconds kArm{100};

  explicit Worker(bool lazy) : lazy_(lazy), thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(c10::intrusive_ptr<Task> task) {
    bool wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back({std::move(task), Clock::now()});
      wake = !lazy_ || sleeping_ || queue_.size() > 1;
    }
    if (wake) cv_.notify_one();
  }
  // Starts the queued Tasks now (somebody polls one).
  void kick() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty() || kicked_) return;
      kicked_ = true;
    }
    cv_.notify_one();
  }
  // Runs the queued Tasks up to and including `task` on the calling thread while the worker thread is not running
  // one; returns when `task` ran here, or as soon as the worker thread holds the queue (the caller then waits).
  void help(const Task* task) {
    while (true) {
      c10::intrusive_ptr<Task> next;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (busy_ || std::none_of(queue_.begin(), queue_.end(), [&](const Queued& q) { return q.task.get() == task; }))
          return;
        next = std::move(queue_.front().task);
        queue_.pop_front();
        busy_ = true;
        kicked_ = false;
      }
      next->run();
      bool wake;
      {
        std::lock_guard<std::mutex> lk(mu_);
        busy_ = false;
        wake = !queue_.empty() || parked_;
      }
      if (wake) cv_.notify_one();  // what was queued behind it is asynchronous: start it (or: back to its timer)
      if (next.get() == task) return;
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Queued {
    c10::intrusive_ptr<Task> task;
    Clock::time_point since;
  };
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    auto armedUntil = Clock::now() + kArm;
    while (true) {
      auto now = Clock::now();
      if (!busy_ && !queue_.empty() &&
          (!lazy_ || stop_ || kicked_ || queue_.size() > 1 || now - queue_.front().since >= kStartDelay)) {
        c10::intrusive_ptr<Task> next = std::move(queue_.front().task);
        queue_.pop_front();
        busy_ = true;
        kicked_ = false;
        lk.unlock();
        next->run();
        lk.lock();
        busy_ = false;
        armedUntil = Clock::now() + kArm;
        continue;
      }
      if (stop_ && !busy_) return;  // the queue is empty
      if (busy_ && lazy_) {
        // A caller runs a Task: no timer until it is done (it wakes this thread then). On a rank bound to one CPU
        // each timer wake-up would preempt the collective in progress, once a millisecond.
        parked_ = true;
        cv_.wait(lk);
        parked_ = false;
        continue;
      }
      if (!busy_ && queue_.empty() && (!lazy_ || now >= armedUntil)) {
        sleeping_ = true;
        cv_.wait(lk);
        sleeping_ = false;
        armedUntil = Clock::now() + kArm;
      } else {
        cv_.wait_until(lk, (busy_ || queue_.empty() ? now : queue_.front().since) + kStartDelay);
      }
    }
  }
  const bool lazy_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  bool busy_ = false;      // a Task is running (on the worker thread or a helping caller)
  bool sleeping_ = false;  // the thread waits without a timer: a push must wake it
  bool kicked_ = false;
  bool parked_ = false;    // the thread waits, without a timer, for a helping caller to finish
  bool stop_ = false;
  std::thread thread_;
};

bool ProcessGroupTopocoll::Task::wait(std::chrono::milliseconds timeout) {
  if (!Work::isCompleted()) worker_->help(this);
  return Work::wait(timeout);
}

bool ProcessGroupTopocoll::Task::isCompleted() {
  if (Work::isCompleted()) return true;
  worker_->kick();
  return false;
}

c10::intrusive_ptr<c10::ivalue::Future> ProcessGroupTopocoll::Task::getFuture() {
  c10::intrusive_ptr<at::ivalue::Future> future;
  bool ran;
  {
    std::lock_guard<std::mutex> lk(futureMu_);
    if (!future_) {
      future_ = c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      if (ran_) complete(*future_);  // it has no callbacks yet; run() completes it otherwise
    }
    future = future_;
    ran = ran_;
  }
  if (!ran) worker_->kick();
  return future;
}

// Messages that arrived for a tag nobody asked for yet (PyTorch matches send/recv by (peer, tag)).
struct ProcessGroupTopocoll::Mailbox {
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> pending;  // (src, tag) -> payloads in arrival order
};

namespace {

struct Header {
  int64_t tag;
  uint64_t bytes;
};

}  // namespace

ProcessGroupTopocoll::ProcessGroupTopocoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                           std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size), store_(store), timeout_(timeout), mailbox_(std::make_unique<Mailbox>()) {
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
  // The group's timeout (init_process_group / new_group timeout=) bounds every wait, as Gloo's; TOPOCOLL_TIMEOUT in
  // the environment wins.
  check(tcclCommInitRankTimeout(&comm_, size, id, rank, std::chrono::duration<double>(timeout).count()),
        "tcclCommInitRankTimeout");
  collWorker_ = std::make_unique<Worker>(/*lazy=*/true);
  sendWorker_ = std::make_unique<Worker>(/*lazy=*/false);
  int hosts = 1;
  check(runtime::capi::hostCount(comm_, &hosts), "hostCount");
  oneHost_ = hosts == 1;
  try {
    stageMin_ = Config::fromEnv(Env::fromProcess()).torchStaging;
  } catch (const Error& e) {
    TORCH_CHECK(false, "ProcessGroupTopocoll: ", e.what());
  }
}

namespace {
// Lets go of the GIL for its scope where this thread holds it. A group dropped from Python is destroyed holding the
// GIL, and joining a worker then deadlocks when the worker's last Task frees a tensor whose Python object it owns
// (TensorImpl's destructor takes the GIL): torch's own bindings release the GIL before destroying a ProcessGroup
// for the same reason, but not every path that drops ours goes through them.
class GilReleased {
 public:
  GilReleased() {
    if (Py_IsInitialized() && PyGILState_Check()) saved_ = PyEval_SaveThread();
  }
  ~GilReleased() {
    if (saved_) PyEval_RestoreThread(saved_);
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};
}  // namespace

ProcessGroupTopocoll::~ProcessGroupTopocoll() {
  GilReleased released;
  collWorker_.reset();  // drains what was queued
  sendWorker_.reset();
  tcclCommDestroy(comm_);
  if (staging_) tcclMemFree(staging_);
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
  // PyTorch's tests and users look for "Timed out" in a call that hit the group's timeout (Gloo's wording).
  TORCH_CHECK(false, "topocoll ", what, " failed: ", rc == tcclTimeout ? "Timed out (the group's timeout): " : "",
              tcclGetErrorString(rc), ": ", detail && detail[0] ? detail : tcclGetLastError(nullptr));
}

char* ProcessGroupTopocoll::staging(size_t bytes) {
  if (stagingBytes_ < bytes) {
    if (staging_) tcclMemFree(staging_);
    staging_ = nullptr;
    stagingBytes_ = 0;
    size_t grown = (bytes + (size_t(2) << 20) - 1) & ~((size_t(2) << 20) - 1);  // whole 2 MiB: fewer regrowths
    check(tcclMemAlloc(&staging_, grown), "tcclMemAlloc (the group's staging buffer)");
    stagingBytes_ = grown;
  }
  return static_cast<char*>(staging_);
}

char* ProcessGroupTopocoll::stageFor(const at::Tensor& t, size_t bytes) {
  // Across hosts nothing is mapped: the copies in and out would only add to the network's time (16 MiB at 2 Gbit/s
  // lost 5-15% of the link to them).
  if (stageMin_ < 0 || getSize() == 1 || !oneHost_ || bytes < static_cast<size_t>(stageMin_) || bytes > kStageMax)
    return nullptr;
  if (transport::regionOf(t.data_ptr(), bytesOf(t)).fd >= 0) return nullptr;  // the peers map it already
  return staging(bytes);
}

const void* ProcessGroupTopocoll::gatherInputs(const std::vector<at::Tensor>& ins) {
  if (ins.empty()) return nullptr;
  if (consecutive(ins)) return ins[0].data_ptr();
  size_t bytes = bytesOf(ins[0]);
  char* flat = staging(bytes * ins.size());
  for (size_t r = 0; r < ins.size(); ++r) std::memcpy(flat + r * bytes, ins[r].data_ptr(), bytes);
  return flat;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::enqueue(Worker& worker, c10d::OpType type,
                                                            std::vector<at::Tensor> outputs,
                                                            std::function<void()> fn,
                                                            const std::vector<at::Tensor>* inputs) {
  // Gloo counts every operation it queues (sends and receives go around its queue, as here on sendWorker_).
  if (&worker == collWorker_.get() && type != c10d::OpType::RECV && type != c10d::OpType::RECVANYSOURCE &&
      sequenceNum_)
    sequenceNum_->increment();
  // The profiler records the inputs' shapes (Gloo's); in place, those are the outputs.
  const std::vector<at::Tensor> profiled = inputs ? *inputs : outputs;
  auto task = c10::make_intrusive<Task>(&worker, getRank(), type, std::move(outputs), std::move(fn), glooEvents_,
                                        profiled);
  worker.push(task);
  return task;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  checkSingle(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "ProcessGroupTopocoll::broadcast: root ",
              opts.rootRank, " out of range");
  at::Tensor t = tensors[0];
  return enqueue(*collWorker_, c10d::OpType::BROADCAST, tensors, [this, t, root = opts.rootRank]() {
    own(t);
    check(tcclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), toTccl(t), root, comm_, nullptr), "tcclBroadcast");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].is_sparse()) return sparseAllreduce(tensors[0], opts);
  checkSingle(tensors, "allreduce");
  at::Tensor t = tensors[0];
  if (bitwise(opts.reduceOp)) {
    checkBitwise(opts.reduceOp, t);
    return enqueue(*collWorker_, c10d::OpType::ALLREDUCE, tensors, [this, t, op = opts.reduceOp]() mutable {
      at::Tensor all = at::empty({getSize(), t.numel()}, t.options());
      check(tcclAllGather(t.data_ptr(), all.data_ptr(), t.numel(), toTccl(t), comm_, nullptr), "tcclAllGather");
      foldBitwise(op, all, t);
    });
  }
  tcclRedOp_t op = toTccl(opts.reduceOp, t);
  return enqueue(*collWorker_, c10d::OpType::ALLREDUCE, tensors, [this, t, op]() {
    own(t);
    size_t bytes = bytesOf(t);
    if (char* s = stageFor(t, bytes)) {  // copy in, all-reduce on mapped memory in place, copy out
      std::memcpy(s, t.data_ptr(), bytes);
      check(tcclAllReduce(s, s, t.numel(), toTccl(t), op, comm_, nullptr), "tcclAllReduce");
      std::memcpy(t.data_ptr(), s, bytes);
      return;
    }
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
    for (auto& t : ts) own(t);
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
  if (bitwise(opts.reduceOp)) {
    checkBitwise(opts.reduceOp, t);
    return enqueue(*collWorker_, c10d::OpType::REDUCE, tensors, [this, t, op = opts.reduceOp,
                                                                 root = opts.rootRank]() mutable {
      at::Tensor all = at::empty({getSize(), t.numel()}, t.options());
      check(tcclAllGather(t.data_ptr(), all.data_ptr(), t.numel(), toTccl(t), comm_, nullptr), "tcclAllGather");
      if (getRank() == root) foldBitwise(op, all, t);
    });
  }
  tcclRedOp_t op = toTccl(opts.reduceOp, t);
  return enqueue(*collWorker_, c10d::OpType::REDUCE, tensors, [this, t, op, root = opts.rootRank]() {
    own(t);
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
  return enqueue(
      *collWorker_, c10d::OpType::ALLGATHER, outs, [this, in, outs]() {
    if (consecutive(outs)) {
      check(tcclAllGather(in.data_ptr(), outs[0].data_ptr(), in.numel(), toTccl(in), comm_, nullptr), "tcclAllGather");
      return;
    }
    size_t bytes = bytesOf(in);
    char* flat = staging(bytes * outs.size());
    check(tcclAllGather(in.data_ptr(), flat, in.numel(), toTccl(in), comm_, nullptr), "tcclAllGather");
    for (size_t r = 0; r < outs.size(); ++r) std::memcpy(outs[r].data_ptr(), flat + r * bytes, bytes);
      },
      &inputs);
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
  const std::vector<at::Tensor> inputs{input};
  return enqueue(*collWorker_, c10d::OpType::_ALLGATHER_BASE, {output}, [this, in, out]() {
    own(in), own(out);
    check(tcclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), toTccl(in), comm_, nullptr), "tcclAllGather");
  }, &inputs);
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
    size_t bytes = bytesOf(in);
    bool direct = outs.empty() || consecutive(outs);
    char* flat = outs.empty() ? nullptr : direct ? static_cast<char*>(outs[0].data_ptr()) : staging(bytes * outs.size());
    check(tcclGather(in.data_ptr(), flat, in.numel(), toTccl(in), root, comm_, nullptr), "tcclGather");
    if (!direct)
      for (size_t r = 0; r < outs.size(); ++r) std::memcpy(outs[r].data_ptr(), flat + r * bytes, bytes);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  checkSingle(outputs, "scatter");
  int root = opts.rootRank;
  TORCH_CHECK(root >= 0 && root < getSize(), "ProcessGroupTopocoll::scatter: root ", root, " out of range");
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "ProcessGroupTopocoll::scatter: the root expects one list of ", getSize(), " input tensors");
    for (auto& i : inputs[0]) checkSameLayout(outputs[0], i, "an input tensor");
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "ProcessGroupTopocoll::scatter: only the root takes inputs");
  }
  at::Tensor out = outputs[0];
  return enqueue(*collWorker_, c10d::OpType::SCATTER, outputs, [this, ins, out, root]() {
    check(tcclScatter(gatherInputs(ins), out.data_ptr(), out.numel(), toTccl(out), root, comm_, nullptr),
          "tcclScatter");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  checkSingle(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "ProcessGroupTopocoll::reduce_scatter: expects one list of ", getSize(), " input tensors");
  for (auto& i : inputs[0]) checkSameLayout(outputs[0], i, "an input tensor");
  std::vector<at::Tensor> ins = inputs[0];
  at::Tensor out = outputs[0];
  tcclRedOp_t op = toTccl(opts.reduceOp, out);
  return enqueue(*collWorker_, c10d::OpType::REDUCE_SCATTER, outputs, [this, ins, out, op]() {
    check(tcclReduceScatter(gatherInputs(ins), out.data_ptr(), out.numel(), toTccl(out), op, comm_, nullptr),
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
    own(in), own(out);
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

// The payload of a message from `src` whose header said (`msgTag`, `bytes`): into `t` when the tag is the one asked
// for (true), else parked for a later receive of that tag (false).
bool ProcessGroupTopocoll::takePayload(at::Tensor& t, int src, int tag, int64_t msgTag, uint64_t bytes) {
  const uint64_t want = static_cast<uint64_t>(t.numel() * t.element_size());
  if (msgTag == tag && bytes == want) {
    check(tcclRecv(t.data_ptr(), bytes, tcclUint8, src, comm_, nullptr), "tcclRecv");
    return true;
  }
  std::vector<char> payload(bytes);
  check(tcclRecv(payload.data(), bytes, tcclUint8, src, comm_, nullptr), "tcclRecv");
  if (msgTag == tag) deliverParked(t, src, tag, payload);  // the size differs: named there
  else mailbox_->pending[{src, static_cast<int>(msgTag)}].push_back(std::move(payload));
  return msgTag == tag;
}

void ProcessGroupTopocoll::deliverParked(at::Tensor& t, int src, int tag, const std::vector<char>& payload) {
  const uint64_t want = static_cast<uint64_t>(t.numel() * t.element_size());
  TORCH_CHECK(payload.size() == want, "ProcessGroupTopocoll::recv: rank ", src, " sent ", payload.size(),
              " bytes with tag ", tag, ", this receive expects ", want);
  std::memcpy(t.data_ptr(), payload.data(), want);
}

void ProcessGroupTopocoll::recvTagged(at::Tensor& t, int src, int tag) {
  auto& box = mailbox_->pending[{src, tag}];
  if (!box.empty()) {
    std::vector<char> payload = std::move(box.front());
    box.pop_front();
    return deliverParked(t, src, tag, payload);
  }
  while (true) {
    Header h{};
    check(tcclRecv(&h, sizeof(h), tcclUint8, src, comm_, nullptr), "tcclRecv (header)");
    if (takePayload(t, src, tag, h.tag, h.bytes)) return;
  }
}

// From any rank: a message of this tag parked earlier comes first (lowest rank first); otherwise the first header
// that arrives from any other rank (tcclRecvAny), its payload parked when its tag is another one. Gloo's
// recvAnysource matches the same way: by tag, whichever rank's message is first.
int ProcessGroupTopocoll::recvAnyTagged(at::Tensor& t, int tag) {
  for (auto& [key, box] : mailbox_->pending) {
    if (key.second != tag || box.empty()) continue;
    std::vector<char> payload = std::move(box.front());
    box.pop_front();
    deliverParked(t, key.first, tag, payload);
    return key.first;
  }
  std::vector<int> others;
  for (int r = 0; r < getSize(); ++r)
    if (r != getRank()) others.push_back(r);
  while (true) {
    Header h{};
    int src = -1;
    check(tcclRecvAny(&h, sizeof(h), tcclUint8, others.data(), static_cast<int>(others.size()), &src, comm_),
          "tcclRecvAny (header)");
    if (takePayload(t, src, tag, h.tag, h.bytes)) return src;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkSingle(tensors, "recv");
  TORCH_CHECK(srcRank >= 0 && srcRank < getSize(), "ProcessGroupTopocoll::recv: rank ", srcRank, " out of range");
  at::Tensor t = tensors[0];
  return enqueue(*collWorker_, c10d::OpType::RECV, tensors,
                 [this, t, srcRank, tag]() mutable { recvTagged(t, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkSingle(tensors, "recvAnysource");
  TORCH_CHECK(getSize() > 1, "ProcessGroupTopocoll::recvAnysource: a group of one rank has no other rank to receive "
              "from");
  at::Tensor t = tensors[0];
  auto source = std::make_shared<std::atomic<int>>(-1);
  auto work = enqueue(*collWorker_, c10d::OpType::RECVANYSOURCE, tensors, [this, t, tag, source]() mutable {
    source->store(recvAnyTagged(t, tag), std::memory_order_release);
  });
  static_cast<Task*>(work.get())->setSource(std::move(source));
  return work;
}

// A barrier whose BarrierOptions.timeout is shorter than the group's (Gloo honours it per call) meets over the store:
// after its earlier operations, each rank sets its key and waits for every other rank's until the deadline, then
// raises "Timed out" naming the ranks that did not arrive. The communicator is not involved, so the group stays
// usable. Otherwise it is the communicator's barrier, bounded by the group's timeout.
c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::barrier(const c10d::BarrierOptions& opts) {
  if (opts.timeout == c10d::kUnsetTimeout || opts.timeout >= timeout_ || getSize() == 1)
    return enqueue(*collWorker_, c10d::OpType::BARRIER, {},
                   [this]() { check(tcclBarrier(comm_, nullptr), "tcclBarrier"); });
  const std::string prefix = "topocoll/timed_barrier/" + std::to_string(timedBarriers_++) + "/";
  return enqueue(*collWorker_, c10d::OpType::BARRIER, {}, [this, prefix, timeout = opts.timeout]() {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    store_->set(prefix + std::to_string(getRank()), std::vector<uint8_t>{1});
    std::vector<int> missing;
    for (int r = 0; r < getSize(); ++r) {
      if (r == getRank()) continue;
      auto left = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                             deadline - std::chrono::steady_clock::now()));
      if (!missing.empty() && !store_->check({prefix + std::to_string(r)})) {
        missing.push_back(r);  // the deadline has passed: the rest are only looked at
        continue;
      }
      try {
        store_->wait({prefix + std::to_string(r)}, left);
      } catch (const std::exception&) {
        missing.push_back(r);
      }
    }
    if (missing.empty()) return;
    TORCH_CHECK(false, "ProcessGroupTopocoll::barrier: Timed out after ", timeout.count(), " ms (the call's timeout): ",
                missing.size() == 1 ? "rank " : "ranks ", joinRanks(missing), " did not arrive");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK(!inputs.empty(), "ProcessGroupTopocoll::allgather_coalesced: no input tensors");
  TORCH_CHECK(static_cast<int>(outputLists.size()) == getSize(), "ProcessGroupTopocoll::allgather_coalesced: ",
              outputLists.size(), " output lists, one per rank (", getSize(), ") expected");
  for (auto& t : inputs) {
    checkTensor(t, "an input tensor");
    TORCH_CHECK(t.scalar_type() == inputs[0].scalar_type(),
                "ProcessGroupTopocoll::allgather_coalesced: every tensor must have the same dtype");
  }
  for (auto& list : outputLists) {
    TORCH_CHECK(list.size() == inputs.size(), "ProcessGroupTopocoll::allgather_coalesced: an output list has ",
                list.size(), " tensors, ", inputs.size(), " expected (one per input)");
    for (size_t i = 0; i < list.size(); ++i) checkSameLayout(inputs[i], list[i], "an output tensor");
  }
  std::vector<at::Tensor> ins = inputs, outs;
  for (auto& list : outputLists) outs.insert(outs.end(), list.begin(), list.end());
  return enqueue(*collWorker_, c10d::OpType::ALLGATHER_COALESCED, outs, [this, ins, outs]() {
    size_t bytes = 0;
    for (auto& t : ins) bytes += bytesOf(t);
    // One buffer: this rank's inputs back to back, then every rank's after the allgather.
    std::vector<char> flat(bytes * (getSize() + 1));
    char* mine = flat.data() + bytes * getSize();
    size_t at = 0;
    for (auto& t : ins) std::memcpy(mine + at, t.data_ptr(), bytesOf(t)), at += bytesOf(t);
    check(tcclAllGather(mine, flat.data(), bytes, tcclUint8, comm_, nullptr), "tcclAllGather (coalesced)");
    for (int r = 0; r < getSize(); ++r) {
      at = 0;
      for (size_t i = 0; i < ins.size(); ++i) {
        const at::Tensor& o = outs[r * ins.size() + i];
        std::memcpy(o.data_ptr(), flat.data() + r * bytes + at, bytesOf(o));
        at += bytesOf(o);
      }
    }
  }, &inputs);
}

void ProcessGroupTopocoll::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const std::string prefix = "topocoll/monitored_barrier/" + std::to_string(monitoredBarriers_++) + "/";
  const auto ms = static_cast<long long>(timeout.count());
  if (getRank() != 0) {
    store_->set(prefix + std::to_string(getRank()), std::vector<uint8_t>{1});
    try {
      store_->wait({prefix + "done"}, timeout);
    } catch (const std::exception&) {
      // Gloo's words (PyTorch's tests match them).
      TORCH_CHECK(false, "Rank ", getRank(), " successfully reached monitoredBarrier, but received errors while "
                  "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.");
    }
    return;
  }
  // As Gloo: each rank gets the time left of the timeout, and when none is left rank 0 says it timed out itself;
  // with waitAllRanks each rank gets the whole timeout, so that every late rank is named.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < getSize(); ++r) {
    auto left = waitAllRanks ? timeout
                             : std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now());
    TORCH_CHECK(left.count() > 0, "Rank 0 timed out in monitoredBarrier after ", ms, " ms.");
    try {
      store_->wait({prefix + std::to_string(r)}, left);
    } catch (const std::exception&) {
      missing.push_back(r);
      if (!waitAllRanks) break;
    }
  }
  if (missing.empty()) {
    store_->set(prefix + "done", std::vector<uint8_t>{1});
    return;
  }
  TORCH_CHECK(false, missing.size() == 1 ? "Rank " : "Ranks ", joinRanks(missing),
              " failed to pass monitoredBarrier in ", ms, " ms");
}

void ProcessGroupTopocoll::setSequenceNumberForGroup() {
  const std::string key = "topocoll/sequence_number";
  if (getRank() == 0) {
    std::random_device rd;
    const uint64_t seq = 1 + (static_cast<uint64_t>(rd()) & 0x7fffffff);
    sequenceNum_ = c10d::SequenceNum(seq);
    store_->set(key, c10d::toVec<uint8_t>(seq, sizeof(uint64_t)));
  } else {
    store_->wait({key}, timeout_);
    sequenceNum_ = c10d::SequenceNum(c10d::fromVec<uint8_t>(store_->get(key)));
  }
}

uint64_t ProcessGroupTopocoll::getSequenceNumberForGroup() { return sequenceNum_ ? sequenceNum_->get() : 0; }

// Gloo's sparse all_reduce (SUM of COO tensors): each rank coalesces its tensor; the ranks allgather their counts
// of non-zeros, then their indices and values (padded to the largest count); each rank sums the whole set and
// coalesces it. The input becomes the result, as Gloo's does.
c10::intrusive_ptr<c10d::Work> ProcessGroupTopocoll::sparseAllreduce(at::Tensor& tensor,
                                                                    const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensor.device().is_cpu(), "ProcessGroupTopocoll: the sparse tensor is on ", tensor.device(),
              "; only CPU tensors are supported by this build");
  TORCH_CHECK(tensor.layout() == at::kSparse, "ProcessGroupTopocoll: only COO sparse tensors are supported");
  TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM, "ProcessGroupTopocoll: sparse all_reduce supports SUM only");
  at::Tensor values = tensor._values();
  toTccl(values);
  at::Tensor t = tensor;
  return enqueue(*collWorker_, c10d::OpType::ALLREDUCE, {tensor}, [this, t]() mutable {
    at::Tensor in = t.coalesce();
    at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
    const int64_t n = getSize(), sparseDims = idx.size(0);
    // Counts, and the value shape past the first dimension, must agree (checked on the gathered meta).
    at::Tensor meta = at::empty({2}, at::kLong);
    meta[0] = idx.size(1);
    meta[1] = sparseDims;
    at::Tensor metas = at::empty({n, 2}, at::kLong);
    check(tcclAllGather(meta.data_ptr(), metas.data_ptr(), 2, tcclInt64, comm_, nullptr), "tcclAllGather (sizes)");
    int64_t most = 0;
    for (int64_t r = 0; r < n; ++r) {
      TORCH_CHECK(metas[r][1].item<int64_t>() == sparseDims, "ProcessGroupTopocoll: sparse all_reduce: rank ", r,
                  " has ", metas[r][1].item<int64_t>(), " sparse dimensions, this rank ", sparseDims);
      most = std::max(most, metas[r][0].item<int64_t>());
    }
    std::vector<int64_t> valShape = val.sizes().vec();
    valShape[0] = most;
    at::Tensor myIdx = at::zeros({sparseDims, most}, at::kLong), myVal = at::zeros(valShape, val.options());
    if (idx.size(1) > 0) {
      myIdx.narrow(1, 0, idx.size(1)).copy_(idx);
      myVal.narrow(0, 0, val.size(0)).copy_(val);
    }
    std::vector<int64_t> allValShape = valShape;
    allValShape.insert(allValShape.begin(), n);
    at::Tensor allIdx = at::empty({n, sparseDims, most}, at::kLong), allVal = at::empty(allValShape, val.options());
    if (most > 0) {
      check(tcclAllGather(myIdx.data_ptr(), allIdx.data_ptr(), myIdx.numel(), tcclInt64, comm_, nullptr),
            "tcclAllGather (indices)");
      check(tcclAllGather(myVal.data_ptr(), allVal.data_ptr(), myVal.numel(), toTccl(myVal), comm_, nullptr),
            "tcclAllGather (values)");
    }
    std::vector<at::Tensor> idxs, vals;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t k = metas[r][0].item<int64_t>();
      idxs.push_back(allIdx[r].narrow(1, 0, k));
      vals.push_back(allVal[r].narrow(0, 0, k));
    }
    at::Tensor sum = at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), t.sizes()).coalesce();
    t.copy_(sum);
  });
}

void ProcessGroupTopocoll::setProfilingName(const std::string& name) {
  TORCH_CHECK(name == "topocoll" || name == "gloo", "ProcessGroupTopocoll: profiling name \"", name,
              "\": expected \"topocoll\" or \"gloo\"");
  glooEvents_ = name == "gloo";
}

}  // namespace topocoll::torch_backend
