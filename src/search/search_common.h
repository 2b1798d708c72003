// Pieces the channel search's parts share (search.cc and the private headers next to it).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "topocoll/search/graph.h"

namespace topocoll::search::detail {

using topology::Link;
using topology::LinkType;
using topology::Node;
using topology::NodeRef;
using topology::NodeType;
using topology::Path;
using topology::PathType;
using topology::System;

constexpr int T(topology::NodeType t) { return static_cast<int>(t); }
constexpr int P(topology::PathType t) { return static_cast<int>(t); }

// How a channel's next GPU is chosen instead of NCCL's sorted candidates: in PCI order (the first channel's
// first try), or as the previous channel did (same channels).
constexpr int kForcedOrderPci = 1;
constexpr int kForcedOrderReplay = 2;

// A vector that stays on the stack for the usual node sizes (the search recurses once per GPU and channel).
template <typename V, size_t N>
class SmallVec {
 public:
  void push_back(const V& v) {
    if (size_ < N)
      inline_[size_] = v;
    else {
      if (heap_.empty()) heap_.assign(inline_.begin(), inline_.end());
      heap_.push_back(v);
    }
    ++size_;
  }
  V& operator[](size_t i) { return size_ <= N ? inline_[i] : heap_[i]; }
  V* begin() { return size_ <= N ? inline_.data() : heap_.data(); }
  V* end() { return begin() + size_; }
  size_t size() const { return size_; }
  void resize(size_t n) {
    if (size_ > N && n <= N) {
      std::copy(heap_.begin(), heap_.begin() + n, inline_.begin());
      heap_.clear();
    }
    if (n > N) {
      if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + std::min(size_, N));
      heap_.resize(n);
    }
    size_ = n;
  }

 private:
  std::array<V, N> inline_;
  std::vector<V> heap_;
  size_t size_ = 0;
};

}  // namespace topocoll::search::detail
