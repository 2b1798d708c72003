// runtime::Communicator, the public face: every call goes to the communicator's state and parts (comm_impl.h).
#include "comm_impl.h"
#include "one_sided.h"
#include "topocoll/runtime/communicator.h"

namespace topocoll::runtime {

Communicator::Communicator(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::init(const bootstrap::UniqueId& id, int nRanks, int rank,
                                                 const InitOptions& opts) {
  return std::unique_ptr<Communicator>(new Communicator(CommImpl::init(id, nRanks, rank, opts)));
}
std::unique_ptr<Communicator> Communicator::initFromEnv(const Env& env) {
  return std::unique_ptr<Communicator>(new Communicator(CommImpl::initFromEnv(env)));
}
std::unique_ptr<Communicator> Communicator::initWithBootstrap(std::unique_ptr<bootstrap::Bootstrap> bs,
                                                              const InitOptions& opts) {
  return std::unique_ptr<Communicator>(new Communicator(CommImpl::initWithBootstrap(std::move(bs), opts)));
}

int Communicator::rank() const { return impl_->rank_; }
int Communicator::nRanks() const { return impl_->nRanks_; }
int Communicator::nNodes() const { return impl_->plan_.connect.nNodes; }
int Communicator::node() const { return impl_->node_; }
int Communicator::localRank() const { return impl_->localRank_; }
int Communicator::localRanks() const { return impl_->localRanks_; }
int Communicator::intraProcRanks() const { return impl_->intraProcRanks_; }
bool Communicator::hostMemory() const { return impl_->hostMemory(); }
const std::vector<PeerInfo>& Communicator::peers() const { return impl_->peers_; }
const Plan& Communicator::plan() const { return impl_->plan_; }
const search::Connect& Communicator::connect() const { return impl_->plan_.connect; }
const tuning::Model& Communicator::model() const { return impl_->plan_.model; }
const tuning::HostModel& Communicator::hostModel() const { return impl_->hostPolicy_.model; }
tuning::HostLink Communicator::hostLink() const { return impl_->hostPolicy_.link; }
const InitTimings& Communicator::timings() const { return impl_->timings_; }
bootstrap::Bootstrap& Communicator::bootstrap() { return *impl_->bs_; }

Request Communicator::isend(const void* buf, size_t count, DataType type, int peer) {
  return impl_->isend(buf, count, type, peer);
}
Request Communicator::irecv(void* buf, size_t count, DataType type, int peer) {
  return impl_->irecv(buf, count, type, peer);
}
void Communicator::send(const void* buf, size_t count, DataType type, int peer) {
  impl_->send(buf, count, type, peer);
}
void Communicator::recv(void* buf, size_t count, DataType type, int peer) { impl_->recv(buf, count, type, peer); }

int Communicator::recvAny(void* buf, size_t count, DataType type, const int* peers, int nPeers) {
  return impl_->recvAny(buf, count, type, peers, nPeers);
}

Request Communicator::iallReduce(const void* s, void* r, size_t n, DataType t, RedOp op) {
  return impl_->iallReduce(s, r, n, t, op);
}
Request Communicator::ibroadcast(const void* s, void* r, size_t n, DataType t, int root) {
  return impl_->ibroadcast(s, r, n, t, root);
}
Request Communicator::ireduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root) {
  return impl_->ireduce(s, r, n, t, op, root);
}
Request Communicator::iallGather(const void* s, void* r, size_t n, DataType t) {
  return impl_->iallGather(s, r, n, t);
}
Request Communicator::ireduceScatter(const void* s, void* r, size_t n, DataType t, RedOp op) {
  return impl_->ireduceScatter(s, r, n, t, op);
}
void Communicator::allReduce(const void* s, void* r, size_t n, DataType t, RedOp op, void* stream) {
  impl_->allReduce(s, r, n, t, op, stream);
}
void Communicator::broadcast(const void* s, void* r, size_t n, DataType t, int root, void* stream) {
  impl_->broadcast(s, r, n, t, root, stream);
}
void Communicator::reduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root, void* stream) {
  impl_->reduce(s, r, n, t, op, root, stream);
}
void Communicator::allGather(const void* s, void* r, size_t n, DataType t, void* stream) {
  impl_->allGather(s, r, n, t, stream);
}
void Communicator::reduceScatter(const void* s, void* r, size_t n, DataType t, RedOp op, void* stream) {
  impl_->reduceScatter(s, r, n, t, op, stream);
}
void Communicator::allToAll(const void* s, void* r, size_t n, DataType t, void* stream) {
  impl_->allToAll(s, r, n, t, stream);
}
void Communicator::barrier() { impl_->barrier(); }
collectives::Choice Communicator::choose(const collectives::Args& a) const { return impl_->choose(a); }
void Communicator::connectAll() { impl_->connectAll(); }
std::vector<ConnectionInfo> Communicator::connections() const { return impl_->connections(); }
std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  auto c = impl_->split(color, key, nullptr);
  return c ? std::unique_ptr<Communicator>(new Communicator(std::move(c))) : nullptr;
}
std::unique_ptr<Communicator> Communicator::split(int color, int key, const InitOptions& opts) {
  auto c = impl_->split(color, key, &opts);
  return c ? std::unique_ptr<Communicator>(new Communicator(std::move(c))) : nullptr;
}
std::unique_ptr<Communicator> Communicator::shrink(const std::vector<int>& exclude, bool abortFirst) {
  return std::unique_ptr<Communicator>(new Communicator(impl_->shrink(exclude, abortFirst, nullptr)));
}
std::unique_ptr<Communicator> Communicator::shrink(const std::vector<int>& exclude, bool abortFirst,
                                                   const InitOptions& opts) {
  return std::unique_ptr<Communicator>(new Communicator(impl_->shrink(exclude, abortFirst, &opts)));
}
std::unique_ptr<Communicator> Communicator::grow(int newSize, const bootstrap::UniqueId* id) {
  return std::unique_ptr<Communicator>(new Communicator(impl_->grow(newSize, id, nullptr)));
}
void Communicator::abort() { impl_->abort(); }
bool Communicator::aborted() const { return impl_->abort_.load(); }
StatusCode Communicator::asyncError(std::string* why) const {
  std::string w;
  if (!impl_->jobFailure(&w)) return StatusCode::kOk;
  if (why) *why = w;
  return impl_->jobCode();
}

void* Communicator::registerBuffer(void* buf, size_t bytes) { return impl_->oneSided().registerBuffer(buf, bytes); }
void Communicator::deregisterBuffer(void* handle) { impl_->oneSided().deregisterBuffer(handle); }
size_t Communicator::registeredBytes() const { return impl_->oneSided().registeredBytes(); }
Window* Communicator::registerWindow(void* buf, size_t bytes, int flags) {
  return impl_->oneSided().registerWindow(buf, bytes, flags);
}
void Communicator::deregisterWindow(Window* w) { impl_->oneSided().deregisterWindow(w); }
void* Communicator::windowUserPtr(Window* w) const { return impl_->oneSided().userPtr(w); }
void Communicator::putSignal(const void* local, size_t bytes, int peer, Window* w, size_t offset) {
  impl_->oneSided().putSignal(local, bytes, peer, w, offset);
}
void Communicator::signal(int peer) { impl_->oneSided().signal(peer); }
void Communicator::waitSignals(const std::vector<SignalWait>& waits) { impl_->oneSided().waitSignals(waits); }

}  // namespace topocoll::runtime
