// The host-memory cost model: NCCL's time = latency + bytes / bandwidth (src/graph/tuning.cc) with the latency
// counted in steps of the algorithm's critical path, and constants measured by bench/host_calibrate.
#include "topocoll/tuning/host_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <strings.h>

#include "topocoll/status.h"

namespace topocoll::tuning {

namespace {

const char* kLinkNames[] = {"P2P", "SHM", "NET"};
const char* kHostAlgoNames[] = {"Tree", "Ring", "Direct"};

// The constants measured on this project's machine (2-vCPU VM, shared): every combination's fit of
// `bench/host_calibrate` (see docs/collectives.md, Selection, for the run, its load and the fit).
// {link, coll, algo, proto, nChannels, {baseUs, stepUs, gbps}}
const std::initializer_list<HostEntry> kMeasured = {
#include "host_constants.inc"
};

size_t slot(HostLink l, int coll, int algo, int proto, int nChannels) {
  int ch = std::clamp(nChannels, 1, kHostMaxChannels) - 1;
  return (((static_cast<size_t>(l) * kNumColls + coll) * kNumHostAlgos + algo) * kNumProtos + proto) *
             kHostMaxChannels + ch;
}

int indexOf(const std::string& s, const char* const* names, int n) {
  for (int i = 0; i < n; ++i)
    if (strcasecmp(s.c_str(), names[i]) == 0) return i;
  return -1;
}

}  // namespace

const char* hostLinkName(HostLink l) { return kLinkNames[static_cast<int>(l)]; }
const char* hostAlgoName(int a) { return kHostAlgoNames[a]; }

HostModel HostModel::defaults() {
  HostModel m;
  m.source_ = "built-in (bench/host_calibrate on the project's machine)";
  for (const HostEntry& e : kMeasured) m.set(e);
  return m;
}

void HostModel::set(const HostEntry& e) {
  cost_[slot(e.link, e.coll, e.algo, e.proto, e.nChannels)] = e.cost;
}

const HostCost& HostModel::at(HostLink l, int coll, int algo, int proto, int nChannels) const {
  return cost_[slot(l, coll, algo, proto, nChannels)];
}

std::vector<HostEntry> HostModel::entries() const {
  std::vector<HostEntry> out;
  for (int l = 0; l < kNumHostLinks; ++l)
    for (int c = 0; c < kNumColls; ++c)
      for (int a = 0; a < kNumHostAlgos; ++a)
        for (int p = 0; p < kNumProtos; ++p)
          for (int ch = 1; ch <= kHostMaxChannels; ++ch) {
            const HostCost& k = at(static_cast<HostLink>(l), c, a, p, ch);
            if (k.gbps > 0) out.push_back({static_cast<HostLink>(l), c, a, p, ch, k});
          }
  return out;
}

HostModel HostModel::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(StatusCode::kNotFound, "TOPOCOLL_HOST_TUNING={}: cannot open the file", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(StatusCode::kInvalidArgument, "TOPOCOLL_HOST_TUNING={}: not JSON: {}", path, e.what());
  }
  HostModel m = defaults();
  m.source_ = path;
  if (!j.is_object() || !j.contains("entries") || !j["entries"].is_array())
    fail(StatusCode::kInvalidArgument, "TOPOCOLL_HOST_TUNING={}: no \"entries\" array", path);
  size_t i = 0;
  for (const auto& e : j["entries"]) {
    try {
      HostEntry h;
      int link = indexOf(e.at("link").get<std::string>(), kLinkNames, kNumHostLinks);
      h.coll = collFromString(e.at("coll").get<std::string>());
      h.algo = indexOf(e.at("algo").get<std::string>(), kHostAlgoNames, kNumHostAlgos);
      std::string proto = e.at("proto").get<std::string>();
      h.proto = strcasecmp(proto.c_str(), "LL") == 0 ? kLL : strcasecmp(proto.c_str(), "Simple") == 0 ? kSimple : -1;
      h.nChannels = e.at("nChannels").get<int>();
      h.cost.baseUs = e.contains("baseUs") ? e.at("baseUs").get<float>() : 0.0f;
      h.cost.stepUs = e.at("stepUs").get<float>();
      h.cost.gbps = e.at("gbps").get<float>();
      if (link < 0 || h.coll < 0 || h.algo < 0 || h.proto < 0)
        fail(StatusCode::kInvalidArgument, "unknown link, collective, algorithm or protocol");
      if (h.nChannels < 1 || h.nChannels > kHostMaxChannels)
        fail(StatusCode::kInvalidArgument, "nChannels {} is not in [1, {}]", h.nChannels, kHostMaxChannels);
      for (float v : {h.cost.baseUs, h.cost.stepUs, h.cost.gbps})
        if (!(v >= 0) || !std::isfinite(v))
          fail(StatusCode::kInvalidArgument, "baseUs, stepUs and gbps must be finite and >= 0");
      h.link = static_cast<HostLink>(link);
      m.set(h);
    } catch (const Error& err) {
      fail(StatusCode::kInvalidArgument, "TOPOCOLL_HOST_TUNING={}: entry {}: {}", path, i, err.what());
    } catch (const std::exception& err) {
      fail(StatusCode::kInvalidArgument, "TOPOCOLL_HOST_TUNING={}: entry {}: {}", path, i, err.what());
    }
    ++i;
  }
  return m;
}

std::string HostModel::toJson(const std::string& source) const {
  nlohmann::ordered_json j;
  j["source"] = source;
  j["entries"] = nlohmann::ordered_json::array();
  for (const HostEntry& e : entries()) {
    nlohmann::ordered_json r;
    r["link"] = hostLinkName(e.link);
    r["coll"] = collName(e.coll);
    r["algo"] = hostAlgoName(e.algo);
    r["proto"] = protoName(e.proto);
    r["nChannels"] = e.nChannels;
    r["baseUs"] = e.cost.baseUs;
    r["stepUs"] = e.cost.stepUs;
    r["gbps"] = e.cost.gbps;
    j["entries"].push_back(r);
  }
  return j.dump(1) + "\n";
}

HostWork hostWork(const HostQuery& q, int algo, int nChannels) {
  HostWork w;
  const double n = q.nRanks, b = static_cast<double>(q.bytes);
  if (q.nRanks <= 1 || q.bytes == 0) return w;
  const double ch = std::max(1, nChannels), chunk = std::max<double>(1, static_cast<double>(q.chunkBytes));
  auto pieces = [&](double bytes) { return std::max(1.0, std::ceil(bytes / chunk)); };
  switch (q.coll) {
    case kAllReduce:
      if (algo == kHostDirect) {
        w.steps = 1;  // every message at once
        w.bytes = (n - 1) * b;  // each rank receives and reduces everybody's data
      } else if (algo == kTree) {
        const double depth = std::ceil(std::log2(n));
        w.steps = 2 * (depth + pieces(b / ch) - 1);
        w.bytes = 2 * b;
      } else {  // reduce-scatter in slices of one chunk per block, then the all-gather's block steps
        w.steps = (n - 1) * (pieces(b / ch / n) + 1);
        w.bytes = 2 * (n - 1) / n * b;
      }
      break;
    case kBroadcast:
    case kReduce:  // a pipelined chain: n - 1 hops, then one more step per chunk
      w.steps = n - 1 + pieces(b / ch) - 1;
      w.bytes = b;
      break;
    default:  // AllGather, ReduceScatter: n - 1 ring steps of one rank's block
      w.steps = n - 1;
      w.bytes = (n - 1) / n * b;
      break;
  }
  return w;
}

double wireBytes(const HostQuery& q, int algo, const HostWork& w) {
  // Not with one rank a host: there the ring carries the same, and the tree measured slower from 512 KiB (2 x 1 at
  // 2 Gbit/s: 12-19 ms against the ring's 2.2 at 512 KiB; docs/collectives.md, Selection), so it keeps its price.
  if (q.coll == kAllReduce && algo == kTree && q.hosts == 2 && q.nRanks > 2) return static_cast<double>(q.bytes);
  return w.bytes;
}

namespace {

// The two sides of an estimate on nChannels: the hosts' (the calibrated constants: base, steps, bytes at their rate)
// and, across hosts with a NIC rate, the wire's (the bytes at the NICs' rate; 0 otherwise).
struct HostSides {
  double fixedUs = 0;      // base + steps
  double hostBytesUs = 0;  // the bytes at the calibrated rate
  double wireUs = 0;
  double hostUs() const { return fixedUs + hostBytesUs; }
};

HostSides hostSides(const HostCost& k, const HostQuery& q, int algo, int proto, int nChannels) {
  const HostWork w = hostWork(q, algo, nChannels);
  HostSides s;
  s.fixedUs = k.baseUs + w.steps * k.stepUs;
  s.hostBytesUs = w.bytes / (1e3 * k.gbps);
  // Across hosts the NICs bound what the calibrated (host-side) rate allows: the channels share min(channels,
  // rails) of them (NCCL's graphs spread channels over the NICs the same way; its model takes the NIC's speed
  // as the NET bandwidth), and LL's lines carry 4 bytes of data in each 8-byte word (the rest is its flag).
  if (q.link == HostLink::kNet && q.netGBps > 0)
    s.wireUs = (proto == kLL ? 2 : 1) * wireBytes(q, algo, w) / (1e3 * q.netGBps * std::clamp(nChannels, 1, std::max(1, q.rails)));
  return s;
}

}  // namespace

double hostTime(const HostModel& m, const HostQuery& q, int algo, int proto, int nChannels) {
  const HostCost& k = m.at(q.link, q.coll, algo, proto, nChannels);
  if (k.gbps <= 0) return -1;
  if (q.nRanks <= 1 || q.bytes == 0) return 0;
  const HostSides s = hostSides(k, q, algo, proto, nChannels);
  return s.fixedUs + std::max(s.hostBytesUs, s.wireUs);  // the bytes go at the slower of the two
}

int netFlowChannels(const HostModel& m, const HostQuery& q, int algo, int proto, int nChannels) {
  const int rails = std::max(1, q.rails);
  if (q.link != HostLink::kNet || q.netGBps <= 0 || nChannels <= rails) return nChannels;
  const HostCost& k = m.at(q.link, q.coll, algo, proto, rails);
  if (k.gbps <= 0) return nChannels;
  const HostSides s = hostSides(k, q, algo, proto, rails);
  return s.wireUs >= s.hostUs() ? rails : nChannels;
}

HostLimits hostLimits(const Config& cfg, int nRings, bool oneHost, int directMaxRanks) {
  HostLimits lim;
  const Enables en = userEnables(cfg);
  for (int c = 0; c < kNumColls; ++c) {
    for (int p = 0; p < kNumProtos; ++p) lim.proto[c][p] = en.proto[c][p] != 0;
    lim.proto[c][kSimple] = lim.proto[c][kSimple] || lim.proto[c][kLL128];  // LL128 runs as Simple
    lim.proto[c][kLL128] = false;
    lim.algo[c][kTree] = en.algo[c][kTree] != 0;
    lim.algo[c][kRing] = en.algo[c][kRing] != 0;
    lim.algo[c][kHostDirect] = oneHost && cfg.directMax >= 0 && (cfg.algo.empty() || (!lim.algo[c][kTree] && !lim.algo[c][kRing]));
  }
  lim.directMax = cfg.directMax;
  lim.directMaxRanks = directMaxRanks;
  const int rings = std::max(1, nRings);
  lim.maxChannels = std::clamp(std::min(cfg.maxNchannels, cfg.maxCtas > 0 ? cfg.maxCtas : rings), 1, rings);
  lim.minChannels = std::clamp(std::max(cfg.minNchannels, cfg.minCtas), 1, lim.maxChannels);
  return lim;
}

HostChoice hostSelect(const HostModel& m, const HostQuery& q, const HostLimits& lim) {
  const int c = q.coll;
  HostChoice best;
  best.nChannels = lim.minChannels;
  // The chains and rings are the only algorithms of the other collectives; Tree and Direct only reduce everything.
  bool algos[kNumHostAlgos] = {false, true, false};
  if (c == kAllReduce) {
    algos[kTree] = lim.algo[c][kTree] && q.nRanks > 1;
    algos[kRing] = lim.algo[c][kRing];
    algos[kHostDirect] = lim.algo[c][kHostDirect] && q.nRanks <= lim.directMaxRanks &&
                         q.bytes <= static_cast<uint64_t>(std::max(0LL, lim.directMax));
    if (!algos[kTree] && !algos[kRing] && !algos[kHostDirect]) algos[kRing] = true;
  }
  bool protos[kNumProtos] = {lim.proto[c][kLL], false, lim.proto[c][kSimple]};
  if (!protos[kLL] && !protos[kSimple]) protos[kSimple] = true;
  // Direct moves everything in one message on channel 0; Ring and Tree use the channels the limits allow, and the
  // model has constants for 1 and 2 (more run with the constants of 2). Across hosts, no more than one channel per
  // rail once that many keep the NICs the bound: each channel is a TCP flow on its NIC, and on a 500 Mbit/s link
  // two flows measured 3-6% slower than one at 2 x 2 ranks and 9-12% at 3 x 2 (spurious retransmissions, stalls;
  // 2 Gbit/s: the same time), where the summed terms below priced the second channel's fewer steps as a gain.
  // railBound says when the cap changed the pick, for the tuning log.
  double bestTime = std::numeric_limits<double>::infinity();
  double cappedTime = std::numeric_limits<double>::infinity();  // the best the rails' cap left out
  bool found = false;
  const int chMax = std::min(lim.maxChannels, std::max(lim.minChannels, kHostMaxChannels));
  for (int a = 0; a < kNumHostAlgos; ++a) {
    if (!algos[a]) continue;
    for (int p : {kLL, kSimple}) {
      if (!protos[p]) continue;
      // The tree runs one channel across hosts (collectives' allReduceTree: channels there may share a connector).
      const bool oneTree = a == kTree && q.link == HostLink::kNet;
      const int lo = oneTree ? 1 : lim.minChannels;
      const int top = oneTree ? 1 : std::max(lim.minChannels, std::min(chMax, netFlowChannels(m, q, a, p, chMax)));
      if (!oneTree)
        for (int ch = top + 1; ch <= chMax; ++ch)
          if (double t = hostTime(m, q, a, p, ch); t >= 0) cappedTime = std::min(cappedTime, t);
      for (int ch = lo; ch <= top; ++ch) {
        double t = hostTime(m, q, a, p, ch);
        if (t < 0 || !(t < bestTime)) continue;
        bestTime = t;
        best = {a, p, ch, t};
        found = true;
      }
    }
  }
  best.railBound = found && cappedTime < bestTime;  // the cap changed the pick
  if (!found) {  // nothing calibrated among what is left: the first algorithm and protocol left, fewest channels
    for (int a : {static_cast<int>(kRing), static_cast<int>(kTree), kHostDirect})
      if (algos[a]) {
        best.algo = a;
        break;
      }
    best.proto = protos[kSimple] ? kSimple : kLL;
    best.nChannels = lim.minChannels;
    best.timeUs = 0;
  }
  return best;
}

HostCost fitHostCost(const std::vector<HostSample>& samples) {
  // Terms per sample, divided by the time: minimising sum((c . x / t - 1)^2) weighs relative errors, so 8 B and
  // 64 MiB count alike. Every subset of the three terms is solved (normal equations); the best one whose
  // coefficients are all >= 0 wins (non-negative least squares for three unknowns).
  std::vector<std::array<double, 3>> rows;
  for (const HostSample& s : samples)
    if (s.timeUs > 0) rows.push_back({1 / s.timeUs, s.work.steps / s.timeUs, s.work.bytes / s.timeUs});
  HostCost k;
  if (rows.empty()) return k;
  double best = std::numeric_limits<double>::infinity();
  std::array<double, 3> bestC{};
  for (int mask = 1; mask < 8; ++mask) {
    int idx[3], m = 0;
    for (int j = 0; j < 3; ++j)
      if (mask & (1 << j)) idx[m++] = j;
    double a[3][4] = {};
    for (const auto& r : rows)
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < m; ++j) a[i][j] += r[idx[i]] * r[idx[j]];
        a[i][m] += r[idx[i]];
      }
    bool singular = false;
    for (int c = 0; c < m && !singular; ++c) {  // Gauss-Jordan with partial pivoting
      int piv = c;
      for (int i = c + 1; i < m; ++i)
        if (std::abs(a[i][c]) > std::abs(a[piv][c])) piv = i;
      if (std::abs(a[piv][c]) < 1e-300) singular = true;
      if (singular) break;
      std::swap(a[c], a[piv]);
      for (int i = 0; i < m; ++i) {
        if (i == c) continue;
        double f = a[i][c] / a[c][c];
        for (int j = c; j <= m; ++j) a[i][j] -= f * a[c][j];
      }
    }
    if (singular) continue;
    std::array<double, 3> coef{};
    bool ok = true;
    for (int i = 0; i < m; ++i) {
      coef[idx[i]] = a[i][m] / a[i][i];
      ok = ok && coef[idx[i]] >= 0 && std::isfinite(coef[idx[i]]);
    }
    if (!ok) continue;
    double err = 0;
    for (const auto& r : rows) err += std::pow(coef[0] * r[0] + coef[1] * r[1] + coef[2] * r[2] - 1, 2);
    if (err < best * (1 - 1e-9)) best = err, bestC = coef;
  }
  k.baseUs = static_cast<float>(bestC[0]);
  k.stepUs = static_cast<float>(bestC[1]);
  // bestC[2] is microseconds per byte; a combination whose time does not grow with the bytes gets a huge bandwidth.
  k.gbps = bestC[2] > 0 ? static_cast<float>(1e-3 / bestC[2]) : 1e6f;
  return k;
}

}  // namespace topocoll::tuning
