#include "wire.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace topocoll::bootstrap {

bool isIpFamily(uint16_t family) { return family == AF_INET || family == AF_INET6; }

size_t MessageParser::feed(const uint8_t* data, size_t n) {
  size_t used = 0;
  if (state_ == State::kHeader) {
    size_t take = std::min(n, sizeof(Header) - got_);
    std::memcpy(reinterpret_cast<uint8_t*>(&header_) + got_, data, take);
    got_ += take;
    used += take;
    if (got_ < sizeof(Header)) return used;
    if (header_.magic != rules_.magic) {
      foreign_ = true;
      why_ = "wrong magic (another job, or not a topocoll peer)";
    } else if (rules_.nRanks > 0 ? (header_.rank < 0 || header_.rank >= rules_.nRanks) : header_.rank < -1) {
      why_ = "sender rank " + std::to_string(header_.rank) + " out of range";
    } else if (header_.size > rules_.maxBytes) {
      why_ = "message of " + std::to_string(header_.size) + " bytes is over the limit of " +
             std::to_string(rules_.maxBytes);
    }
    if (!why_.empty()) {
      state_ = State::kRejected;
      return used;
    }
    // Grows with what arrives: a header claiming a large body reserves nothing up front.
    body_.clear();
    state_ = header_.size == 0 ? State::kDone : State::kBody;
  }
  if (state_ == State::kBody) {
    size_t take = std::min(n - used, static_cast<size_t>(header_.size) - body_.size());
    body_.insert(body_.end(), data + used, data + used + take);
    used += take;
    if (body_.size() == header_.size) state_ = State::kDone;
  }
  return used;
}

size_t MessageParser::wanted() const {
  if (state_ == State::kHeader) return sizeof(Header) - got_;
  if (state_ == State::kBody) return static_cast<size_t>(header_.size) - body_.size();
  return 0;
}

void MessageParser::reset() {
  state_ = State::kHeader;
  header_ = Header{};
  got_ = 0;
  body_.clear();
  foreign_ = false;
  why_.clear();
}

RegistrationBook::Verdict RegistrationBook::add(const Header& h, const std::vector<uint8_t>& body, std::string* why) {
  if (h.tag != kTagRegister || body.size() != sizeof(Registration)) {
    *why = "not a registration (tag " + std::to_string(h.tag) + ", " + std::to_string(body.size()) + " bytes)";
    return Verdict::kDropped;
  }
  Registration r;
  std::memcpy(&r, body.data(), sizeof(r));
  if (r.nRanks <= 0 || r.nRanks > kMaxRanks) {
    *why = "registration with a job size of " + std::to_string(r.nRanks);
    return Verdict::kDropped;
  }
  if (h.rank < 0 || h.rank >= r.nRanks) {
    *why = "registration of rank " + std::to_string(h.rank) + " of " + std::to_string(r.nRanks);
    return Verdict::kDropped;
  }
  if (!isIpFamily(r.listen.family) || r.listen.port == 0) {
    *why = "registration of rank " + std::to_string(h.rank) + " with no listening address (family " +
           std::to_string(r.listen.family) + ")";
    return Verdict::kDropped;
  }
  if (r.timeoutMs <= 0 || r.timeoutMs > 86400LL * 1000) {
    *why = "registration of rank " + std::to_string(h.rank) + " with a timeout of " + std::to_string(r.timeoutMs) + " ms";
    return Verdict::kDropped;
  }
  if (nRanks_ > 0 && r.nRanks != nRanks_) {
    *why = "rank " + std::to_string(h.rank) + " was started with WORLD_SIZE=" + std::to_string(r.nRanks) + ", " +
           (rootKnowsSize_ ? std::string("the root") : "rank " + std::to_string(firstRank_)) + " with " +
           std::to_string(nRanks_);
    return Verdict::kJobFails;
  }
  if (nRanks_ == 0) {
    nRanks_ = r.nRanks;
    firstRank_ = h.rank;
  }
  if (regs_.empty()) timeoutMs_ = r.timeoutMs;
  if (!regs_.emplace(h.rank, r).second) {
    *why = "rank " + std::to_string(h.rank) + " registered twice (two processes were started as rank " +
           std::to_string(h.rank) + ", or two jobs that cannot be told apart share the root's address)";
    return Verdict::kJobFails;
  }
  return Verdict::kAccepted;
}

std::string RegistrationBook::missingText() const {
  std::string missing;
  int shown = 0, total = nRanks_ - registered();
  for (int r = 0; r < nRanks_ && shown < 32; ++r) {
    if (has(r)) continue;
    missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    ++shown;
  }
  if (total > shown) missing += ", ... (" + std::to_string(total) + " in all)";
  return "rank(s) " + missing + " of " + std::to_string(nRanks_) + " never registered with the root";
}

}  // namespace topocoll::bootstrap
