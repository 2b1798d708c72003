// Groups (runtime private; NCCL 2.30.7 src/group.cc): the state is per thread and spans communicators. Operations
// issued between groupStart() and the outermost groupEnd() join this thread's group instead of running; groupEnd
// runs them together (groups.cc). Point-to-point calls (p2p.cc) and collectives (collectives.cc) add to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "coll_task.h"
#include "topocoll/datatype.h"
#include "topocoll/progress/engine.h"

namespace topocoll::transport {
struct Connector;
}  // namespace topocoll::transport

namespace topocoll::runtime::detail {

/// A group's small send or receive recorded without an op (PointToPoint::recordGroupShot): what the op would hold.
struct GroupShot {
  CommImpl* comm = nullptr;
  transport::Connector* conn = nullptr;  // whose point-to-point mailbox it uses
  void* buf = nullptr;
  size_t count = 0, bytes = 0;
  DataType type = DataType::kUint8;
  int peer = -1;
  bool send = false;
  uint32_t index = 0;  // its place among the sends to (receives from) peer
};

/// Whether this thread has an open group.
bool inGroup();
/// A point-to-point operation joins the group, after the records before it (which become operations first, so that
/// each peer's messages keep their order).
void addOpToGroup(CommImpl* comm, std::shared_ptr<progress::Op> op);
/// Whether the group may take a record of `comm` now: it holds nothing but records of `comm`, and has room.
bool groupTakesShot(const CommImpl* comm);
void addShotToGroup(const GroupShot& s);
/// Whether the open group holds `t` (its request may not be waited for before groupEnd()).
bool groupHolds(const std::shared_ptr<CollTask>& t);

}  // namespace topocoll::runtime::detail
