#include "topocoll/topology/xml.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <unordered_map>
#include <unordered_set>

#include <pugixml.hpp>

#include "topocoll/status.h"
#include "topocoll/unique_fd.h"

namespace topocoll::topology {

const std::string* XmlNode::attr(std::string_view key) const {
  for (auto& [k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

void XmlNode::set(std::string_view key, std::string value) {
  for (auto& [k, v] : attrs) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  attrs.emplace_back(std::string(key), std::move(value));
}

void XmlNode::setIfUnset(std::string_view key, std::string value) {
  if (!has(key)) attrs.emplace_back(std::string(key), std::move(value));
}

void XmlNode::unset(std::string_view key) {
  for (auto it = attrs.begin(); it != attrs.end(); ++it) {
    if (it->first == key) {
      attrs.erase(it);
      return;
    }
  }
}

XmlNode* XmlNode::addChild(std::string childName) {
  auto n = std::make_unique<XmlNode>();
  n->name = std::move(childName);
  n->parent = this;
  subs.push_back(std::move(n));
  return subs.back().get();
}

XmlNode* XmlNode::child(std::string_view n) const {
  for (auto& s : subs)
    if (s->name == n) return s.get();
  return nullptr;
}

XmlNode* XmlNode::childWith(std::string_view n, std::string_view key, std::string_view value) const {
  for (auto& s : subs) {
    if (s->name != n) continue;
    const std::string* v = s->attr(key);
    if (v && *v == value) return s.get();
  }
  return nullptr;
}

std::unique_ptr<XmlNode> XmlNode::removeChild(const XmlNode* sub) {
  for (auto it = subs.begin(); it != subs.end(); ++it) {
    if (it->get() == sub) {
      auto owned = std::move(*it);
      subs.erase(it);
      owned->parent = nullptr;
      return owned;
    }
  }
  return nullptr;
}

std::unique_ptr<XmlNode> XmlNode::clone(XmlNode* newParent) const {
  auto n = std::make_unique<XmlNode>();
  n->name = name;
  n->attrs = attrs;
  n->line = line;
  n->parent = newParent;
  n->subs.reserve(subs.size());
  for (auto& s : subs) n->subs.push_back(s->clone(n.get()));
  return n;
}

XmlNode* XmlNode::find(std::string_view n) {
  if (name == n) return this;
  for (auto& s : subs)
    if (XmlNode* r = s->find(n)) return r;
  return nullptr;
}

XmlNode* XmlNode::findWith(std::string_view n, std::string_view key, std::string_view value) {
  if (name == n) {
    const std::string* v = attr(key);
    if (v && *v == value) return this;
  }
  for (auto& s : subs)
    if (XmlNode* r = s->findWith(n, key, value)) return r;
  return nullptr;
}

XmlDoc XmlDoc::clone() const {
  XmlDoc d;
  d.source = source;
  if (root) d.root = root->clone();
  return d;
}

std::string XmlDoc::where(const XmlNode& node) const {
  if (node.line > 0) return source + ":" + std::to_string(node.line);
  return source;
}

namespace {

struct LineIndex {
  std::vector<size_t> starts;
  explicit LineIndex(std::string_view text) {
    starts.push_back(0);
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') starts.push_back(i + 1);
  }
  int lineOf(ptrdiff_t offset) const {
    if (offset < 0) return 0;
    auto it = std::upper_bound(starts.begin(), starts.end(), static_cast<size_t>(offset));
    return static_cast<int>(it - starts.begin());
  }
};

std::unique_ptr<XmlNode> convert(const pugi::xml_node& src, XmlNode* parent, const LineIndex& lines,
                                 const std::string& source, int depth) {
  if (depth > 256) fail(StatusCode::kInvalidArgument, "{}: XML nesting deeper than 256 levels", source);
  auto n = std::make_unique<XmlNode>();
  n->name = src.name();
  n->parent = parent;
  n->line = lines.lineOf(src.offset_debug());
  for (auto a = src.first_attribute(); a; a = a.next_attribute()) n->attrs.emplace_back(a.name(), a.value());
  if (n->attrs.size() > 1) {  // sorted names: a duplicate check in n log n however many attributes there are
    std::vector<std::string_view> names;
    for (auto& [k, v] : n->attrs) names.push_back(k);
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end())
      fail(StatusCode::kInvalidArgument, "{}:{}: duplicate attribute '{}' on <{}>", source, n->line, *dup, n->name);
  }
  for (auto c = src.first_child(); c; c = c.next_sibling()) {
    if (c.type() != pugi::node_element) continue;
    n->subs.push_back(convert(c, n.get(), lines, source, depth + 1));
  }
  return n;
}

}  // namespace

XmlDoc parseXml(std::string_view text, const std::string& source) {
  pugi::xml_document doc;
  auto res = doc.load_buffer(text.data(), text.size(), pugi::parse_default | pugi::parse_ws_pcdata_single,
                             pugi::encoding_utf8);
  LineIndex lines(text);
  if (!res) {
    fail(StatusCode::kInvalidArgument, "{}:{}: malformed XML: {}", source, lines.lineOf(res.offset),
         res.description());
  }
  pugi::xml_node top;
  int nTop = 0;
  for (auto c = doc.first_child(); c; c = c.next_sibling()) {
    if (c.type() == pugi::node_element) {
      if (!top) top = c;
      ++nTop;
    }
  }
  if (!top) fail(StatusCode::kInvalidArgument, "{}: no XML element found", source);
  if (nTop > 1) fail(StatusCode::kInvalidArgument, "{}: more than one top-level element", source);
  XmlDoc d;
  d.source = source;
  d.root = convert(top, nullptr, lines, source, 0);
  return d;
}

XmlDoc loadXmlFile(const std::string& path) {
  // Opened first, then checked through the descriptor: what is read is what was checked.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) fail(StatusCode::kNotFound, "{}: cannot open file: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) fail(StatusCode::kSystemError, "{}: cannot stat: {}", path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(StatusCode::kInvalidArgument, "{}: is a directory, not a topology file", path);
  if (!S_ISREG(st.st_mode))
    fail(StatusCode::kInvalidArgument, "{}: is not a regular file (a device, pipe or socket), not a topology file", path);
  if (static_cast<uint64_t>(st.st_size) > kMaxXmlFileBytes)
    fail(StatusCode::kInvalidArgument, "{}: {} bytes, over the {} MiB limit for a topology or graph file", path,
         st.st_size, kMaxXmlFileBytes >> 20);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {  // a file that shrinks meanwhile ends early; one that grows is read up to its size
    ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(StatusCode::kSystemError, "{}: read error: {}", path, std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return parseXml(text, path);
}

XmlNode& systemElement(const XmlDoc& doc) {
  if (!doc.root) fail(StatusCode::kInvalidArgument, "{}: no XML element", doc.source);
  if (doc.root->name == "system") return *doc.root;
  if (doc.root->name == "graphs")
    fail(StatusCode::kInvalidArgument,
         "{}: the root element is <graphs>: this is a graph file (NCCL_GRAPH_FILE), use --graph-in; a topology's root "
         "is <system>", doc.where(*doc.root));
  fail(StatusCode::kInvalidArgument, "{}: the root element is <{}>; a topology's root is <system>", doc.where(*doc.root),
       doc.root->name);
}

namespace {
void writeRec(std::string& out, const XmlNode& n, int indent) {
  out.append(indent, ' ');
  out += '<';
  out += n.name;
  for (auto& [k, v] : n.attrs) {
    out += ' ';
    out += k;
    out += "=\"";
    out += v;
    out += '"';
  }
  if (n.subs.empty()) {
    out += "/>\n";
    return;
  }
  out += ">\n";
  for (auto& s : n.subs) writeRec(out, *s, indent + 2);
  out.append(indent, ' ');
  out += "</";
  out += n.name;
  out += ">\n";
}
}  // namespace

std::string toString(const XmlNode& root) {
  std::string out;
  writeRec(out, root, 0);
  return out;
}

void writeXmlFile(const std::string& path, const XmlNode& root) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(StatusCode::kSystemError, "{}: cannot open for writing: {}", path, std::strerror(errno));
  out << toString(root);
  if (!out) fail(StatusCode::kSystemError, "{}: write error", path);
}

namespace {

bool removable(const std::string& name) { return name == "pci" || name == "cpu" || name == "nic" || name == "net"; }
bool keeps(const XmlNode& n) {
  const std::string* k = n.attr("keep");
  return k && *k == "1";
}

// ncclTopoTrimXml's recursion: the count of kept elements below (a kept element counts one and is not entered);
// branches that keep nothing are removed, all of a node's at once (removing them one by one is quadratic).
int trimRec(XmlNode& node) {
  if (keeps(node)) {
    node.unset("keep");
    return 1;
  }
  int keep = 0;
  std::vector<uint8_t> drop(node.subs.size(), 0);
  for (size_t i = 0; i < node.subs.size(); ++i) {
    int sk = trimRec(*node.subs[i]);
    keep += sk;
    drop[i] = sk == 0 && removable(node.subs[i]->name);
  }
  size_t out = 0;
  for (size_t i = 0; i < node.subs.size(); ++i)
    if (!drop[i]) node.subs[out++] = std::move(node.subs[i]);
  node.subs.resize(out);
  return keep;
}

// What ncclTopoFuseXml's matching compares: name, the attribute set and whether the element has children.
std::string signature(const XmlNode& n) {
  std::vector<const std::pair<std::string, std::string>*> attrs;
  for (auto& a : n.attrs) attrs.push_back(&a);
  std::sort(attrs.begin(), attrs.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::string sig = n.name;
  sig += n.subs.empty() ? '\x01' : '\x02';
  for (auto* a : attrs) {
    sig += a->first;
    sig += '\0';
    sig += a->second;
    sig += '\0';
  }
  return sig;
}

// Each of src's children merges into the first of dst's children with the same signature, or is appended (and
// then matches src's later children). An index makes it linear where a scan of dst's children was quadratic.
void fuseRec(XmlNode& dst, const XmlNode& src) {
  if (src.subs.empty()) return;
  std::unordered_map<std::string, XmlNode*> first;
  first.reserve(dst.subs.size() + src.subs.size());
  for (auto& d : dst.subs) first.emplace(signature(*d), d.get());
  for (auto& s : src.subs) {
    auto [it, added] = first.emplace(signature(*s), nullptr);
    if (added) {
      dst.subs.push_back(s->clone(&dst));
      it->second = dst.subs.back().get();
    } else {
      fuseRec(*it->second, *s);
    }
  }
}

}  // namespace

void trimXml(XmlNode& root) { trimRec(root); }

void fuseXml(XmlNode& dst, const XmlNode& src) {
  XmlNode* d = dst.find("system");
  const XmlNode* s = const_cast<XmlNode&>(src).find("system");
  if (!d || !s) fail(StatusCode::kInvalidArgument, "fuseXml: both documents need a <system> element");
  fuseRec(*d, *s);
}

TrimmedCopies::TrimmedCopies(const XmlNode& root) : root_(root) {
  // Post-order: a node holds a kept element when it keeps or a child holds one.
  struct Walk {
    std::unordered_set<const XmlNode*>& out;
    bool operator()(const XmlNode& n) {
      bool any = keeps(n);
      for (auto& c : n.subs) any |= (*this)(*c);
      if (any) out.insert(&n);
      return any;
    }
  };
  Walk{holdsKeep_}(root);
}

std::unique_ptr<XmlNode> TrimmedCopies::copy(const XmlNode* target, const std::function<void(XmlNode&)>& edit) const {
  // The target's ancestors hold a kept element in this copy when the edit makes the target keep.
  XmlNode edited;
  edited.name = target->name;
  edited.attrs = target->attrs;
  edit(edited);
  std::unordered_set<const XmlNode*> path;
  if (keeps(edited))
    for (const XmlNode* n = target; n; n = n->parent) path.insert(n);
  Ctx ctx{target, edit, std::move(path)};
  return copyTrimmed(root_, nullptr, ctx);
}

std::unique_ptr<XmlNode> TrimmedCopies::shallow(const XmlNode& n, XmlNode* parent, const Ctx& ctx) const {
  auto c = std::make_unique<XmlNode>();
  c->name = n.name;
  c->attrs = n.attrs;
  c->line = n.line;
  c->parent = parent;
  if (&n == ctx.target) ctx.edit(*c);
  return c;
}

std::unique_ptr<XmlNode> TrimmedCopies::copyWhole(const XmlNode& n, XmlNode* parent, const Ctx& ctx) const {
  auto c = shallow(n, parent, ctx);
  c->subs.reserve(n.subs.size());
  for (auto& s : n.subs) c->subs.push_back(copyWhole(*s, c.get(), ctx));
  return c;
}

std::unique_ptr<XmlNode> TrimmedCopies::copyTrimmed(const XmlNode& n, XmlNode* parent, const Ctx& ctx) const {
  auto c = shallow(n, parent, ctx);
  if (keeps(*c)) {  // kept whole, as trimRec does not enter it
    c->unset("keep");
    c->subs.reserve(n.subs.size());
    for (auto& s : n.subs) c->subs.push_back(copyWhole(*s, c.get(), ctx));
    return c;
  }
  for (auto& s : n.subs) {
    bool holds = holdsKeep_.count(s.get()) || ctx.path.count(s.get());
    if (!holds && removable(s->name)) continue;  // what trimRec removes is never copied
    c->subs.push_back(copyTrimmed(*s, c.get(), ctx));
  }
  return c;
}

}  // namespace topocoll::topology
