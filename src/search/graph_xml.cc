// Graph XML, as NCCL_GRAPH_DUMP_FILE writes it and NCCL_GRAPH_FILE reads it. Follows NCCL 2.30.7
// src/graph/search.cc (ncclTopoGetXmlFromGraphs, ncclTopoGetGraphFromXml) (Apache-2.0).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <set>

#include "topocoll/search/graph.h"
#include "topocoll/status.h"

namespace topocoll::search {

using topology::NodeType;
using topology::PathType;
using topology::System;
using topology::XmlDoc;
using topology::XmlNode;

namespace {

std::string hexLong(int64_t v) { return v == 0 ? "0" : fmt::format("{:#x}", static_cast<uint64_t>(v)); }

const char* linkTypeName(int t) {
  // NCCL's kvDictLinkType; C2C, NET and DIS have no entry there.
  return t >= 0 && t < topology::kPathTypes ? topology::to_string(static_cast<PathType>(t)) : "SYS";
}

int64_t gpuDevId(const System& sys, int rank) {
  int g = sys.gpuIndexOfRank(rank);
  if (g < 0) fail(StatusCode::kInternal, "graph XML: rank {} not found", rank);
  const auto& gpu = sys.of(NodeType::GPU)[g];
  return topology::makeId(topology::systemIdOf(gpu.id), gpu.dev);
}

}  // namespace

std::string graphsToXml(const System& sys, const std::vector<const Graph*>& graphs, bool ranks) {
  XmlNode root;
  root.name = "graphs";
  root.set("version", "1");
  int ngpus = sys.count(NodeType::GPU);
  for (const Graph* g : graphs) {
    XmlNode* xg = root.addChild("graph");
    xg->set("id", std::to_string(g->id));
    xg->set("pattern", std::to_string(g->pattern));
    xg->set("crossnic", std::to_string(g->crossNic));
    xg->set("nchannels", std::to_string(g->nChannels));
    xg->set("speedintra", fmt::format("{:g}", g->bwIntra));
    xg->set("speedinter", fmt::format("{:g}", g->bwInter));
    xg->set("latencyinter", fmt::format("{:g}", g->latencyInter));
    xg->set("typeintra", linkTypeName(g->typeIntra));
    xg->set("typeinter", linkTypeName(g->typeInter));
    xg->set("samechannels", std::to_string(g->sameChannels));
    for (int c = 0; c < g->nChannels; ++c) {
      XmlNode* ch = xg->addChild("channel");
      if (sys.inter) ch->addChild("net")->set("dev", hexLong(g->inter[2 * c]));
      for (int i = 0; i < ngpus; ++i) {
        XmlNode* x = ch->addChild("gpu");
        int rank = g->intra[ngpus * c + i];
        x->set("dev", hexLong(gpuDevId(sys, rank)));
        if (ranks) x->set("rank", std::to_string(rank));
        if (g->id == kGraphIdNvls) break;  // NVLS channels name their head only
      }
      if (sys.inter) ch->addChild("net")->set("dev", hexLong(g->inter[2 * c + 1]));
    }
  }
  return topology::toString(root);
}

int graphFromXml(const XmlDoc& doc, const System& sys, const Config& cfg, Graph& graph) {
  XmlNode* graphs = doc.root && doc.root->name == "graphs" ? doc.root.get() : nullptr;
  if (doc.root && doc.root->name == "system")
    fail(StatusCode::kInvalidArgument, "{}: the root element is <system>: this is a topology file (--topo, "
         "NCCL_TOPO_FILE), not a graph file", doc.where(*doc.root));
  if (!graphs) fail(StatusCode::kInvalidArgument, "{}: the root element is not <graphs>: not a graph file", doc.source);
  const std::string* ver = graphs->attr("version");
  if (!ver || *ver != "1")
    fail(StatusCode::kInvalidArgument, "{}: <graphs version=\"{}\">: version 1 needed", doc.where(*graphs),
         ver ? *ver : "");
  auto reqInt = [&](const XmlNode& x, const char* k) {
    const std::string* v = x.attr(k);
    if (!v) fail(StatusCode::kInvalidArgument, "{}: <{}> is missing attribute '{}'", doc.where(x), x.name, k);
    char* end = nullptr;
    errno = 0;
    long long r = std::strtoll(v->c_str(), &end, 0);
    if (v->empty() || *end) fail(StatusCode::kInvalidArgument, "{}: {}=\"{}\" is not an integer", doc.where(x), k, *v);
    if (errno == ERANGE || r < INT32_MIN || r > INT32_MAX)
      fail(StatusCode::kInvalidArgument, "{}: {}=\"{}\" is out of range", doc.where(x), k, *v);
    return static_cast<int>(r);
  };
  auto reqFloat = [&](const XmlNode& x, const char* k) {
    const std::string* v = x.attr(k);
    if (!v) fail(StatusCode::kInvalidArgument, "{}: <{}> is missing attribute '{}'", doc.where(x), x.name, k);
    char* end = nullptr;
    errno = 0;
    double r = std::strtod(v->c_str(), &end);
    if (v->empty() || *end) fail(StatusCode::kInvalidArgument, "{}: {}=\"{}\" is not a number", doc.where(x), k, *v);
    if (errno == ERANGE || !std::isfinite(r) || r < 0 || r > 1e9)
      fail(StatusCode::kInvalidArgument, "{}: {}=\"{}\" is out of range [0, 1e9]", doc.where(x), k, *v);
    return static_cast<float>(r);
  };
  int loaded = 0;
  const int ngpus = sys.count(NodeType::GPU);
  // Room for every channel the file may hold (compute() sizes them so already; other callers need not).
  if (graph.intra.size() < static_cast<size_t>(kMaxChannels) * std::max(ngpus, 1))
    graph.intra.assign(static_cast<size_t>(kMaxChannels) * std::max(ngpus, 1), 0);
  if (graph.inter.size() < static_cast<size_t>(kMaxChannels) * 2) graph.inter.assign(kMaxChannels * 2, 0);
  for (auto& sub : graphs->subs) {
    if (sub->name != "graph") continue;
    const XmlNode& xg = *sub;
    if (reqInt(xg, "id") != graph.id) continue;
    int crossNic = reqInt(xg, "crossnic");
    if (cfg.crossNic == 0 && crossNic == 1) continue;
    graph.crossNic = crossNic;
    graph.pattern = reqInt(xg, "pattern");
    graph.nChannels = reqInt(xg, "nchannels");
    graph.bwIntra = reqFloat(xg, "speedintra");
    graph.bwInter = reqFloat(xg, "speedinter");
    graph.latencyInter = xg.has("latencyinter") ? reqFloat(xg, "latencyinter") : 0.0f;
    for (auto [key, dst] : {std::pair{"typeintra", &graph.typeIntra}, std::pair{"typeinter", &graph.typeInter}}) {
      const std::string* t = xg.attr(key);
      int v = t ? topology::pathTypeFromString(*t) : -1;
      if (v < 0 || v > static_cast<int>(PathType::SYS))
        fail(StatusCode::kInvalidArgument, "{}: {}=\"{}\" is not a path type (LOC..SYS)", doc.where(xg), key,
             t ? *t : "");
      *dst = v;
    }
    graph.sameChannels = reqInt(xg, "samechannels");
    int c = 0;
    for (auto& ch : xg.subs) {
      if (ch->name != "channel") continue;
      if (c >= kMaxChannels) fail(StatusCode::kInvalidArgument, "{}: more than {} channels", doc.where(*ch), kMaxChannels);
      int nNet = 0, nGpu = 0;
      std::set<int> seen;
      for (auto& x : ch->subs) {
        const std::string* d = x->attr("dev");
        if (!d) fail(StatusCode::kInvalidArgument, "{}: <{}> is missing attribute 'dev'", doc.where(*x), x->name);
        int64_t dev = std::strtoll(d->c_str(), nullptr, 16);
        if (x->name == "net") {
          if (nNet >= 2) fail(StatusCode::kInvalidArgument, "{}: a channel has at most two <net>", doc.where(*x));
          if (sys.indexOf(NodeType::NET, dev) < 0)
            fail(StatusCode::kInvalidArgument, "{}: NET dev {} is not in the topology", doc.where(*x), *d);
          graph.inter[2 * c + nNet++] = dev;
        } else if (x->name == "gpu") {
          int rank = -1;
          if (x->has("rank")) {
            rank = reqInt(*x, "rank");
          } else {
            for (auto& g : sys.of(NodeType::GPU))
              if (topology::makeId(topology::systemIdOf(g.id), g.dev) == dev) rank = g.rank;
          }
          if (rank < 0 || sys.gpuIndexOfRank(rank) < 0)
            fail(StatusCode::kInvalidArgument, "{}: GPU dev {} (rank {}) is not in the topology", doc.where(*x), *d, rank);
          if (nGpu >= ngpus) fail(StatusCode::kInvalidArgument, "{}: channel has more GPUs than the node", doc.where(*x));
          if (!seen.insert(rank).second)
            fail(StatusCode::kInvalidArgument, "{}: rank {} appears twice in one channel", doc.where(*x), rank);
          graph.intra[ngpus * c + nGpu++] = rank;
        }
      }
      if (graph.id != 3 && nGpu != ngpus)
        fail(StatusCode::kInvalidArgument, "{}: channel lists {} GPUs, the node has {}: not a permutation",
             doc.where(*ch), nGpu, ngpus);
      ++c;
    }
    loaded = c;
  }
  return loaded;
}

}  // namespace topocoll::search
