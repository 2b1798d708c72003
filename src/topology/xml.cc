#include "topocoll/topology/xml.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include <pugixml.hpp>

#include "topocoll/status.h"

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
  for (auto a = src.first_attribute(); a; a = a.next_attribute()) {
    if (n->has(a.name()))
      fail(StatusCode::kInvalidArgument, "{}:{}: duplicate attribute '{}' on <{}>", source, n->line, a.name(),
           n->name);
    n->attrs.emplace_back(a.name(), a.value());
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
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(StatusCode::kNotFound, "{}: cannot open file: {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(StatusCode::kSystemError, "{}: read error", path);
  return parseXml(ss.str(), path);
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
int trimRec(XmlNode& node) {
  const std::string* k = node.attr("keep");
  if (k && *k == "1") {
    node.unset("keep");
    return 1;
  }
  int keep = 0;
  // Children may remove themselves: iterate over a snapshot.
  std::vector<XmlNode*> snapshot;
  for (auto& s : node.subs) snapshot.push_back(s.get());
  for (XmlNode* s : snapshot) {
    int sk = trimRec(*s);
    keep += sk;
    if (sk == 0 && (s->name == "pci" || s->name == "cpu" || s->name == "nic" || s->name == "net"))
      node.removeChild(s);
  }
  return keep;
}

bool sameElement(const XmlNode& a, const XmlNode& b) {
  if (a.name != b.name || a.attrs.size() != b.attrs.size() || a.subs.empty() != b.subs.empty()) return false;
  for (auto& [k, v] : b.attrs) {
    const std::string* av = a.attr(k);
    if (!av || *av != v) return false;
  }
  return true;
}

void fuseRec(XmlNode& dst, const XmlNode& src) {
  for (auto& s : src.subs) {
    XmlNode* match = nullptr;
    for (auto& d : dst.subs) {
      if (sameElement(*d, *s)) {
        match = d.get();
        break;
      }
    }
    if (!match) dst.subs.push_back(s->clone(&dst));
    else fuseRec(*match, *s);
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

}  // namespace topocoll::topology
