// NCCL's topology/graph XML format: a lossless in-memory tree, the loader and the writer.
//
// Canonical form (what `toString` writes and what NCCL_TOPO_DUMP_FILE contains): one element per line,
// two-space indentation, attributes in their original order as `key="value"`, childless elements closed
// with `/>`, no XML declaration, comments or text. Loading then writing a canonical file reproduces it byte
// for byte; unknown elements and attributes are kept.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace topocoll::topology {

/// One XML element. Attributes keep their order (NCCL writes them in insertion order).
struct XmlNode {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<std::unique_ptr<XmlNode>> subs;
  XmlNode* parent = nullptr;
  int line = 0;  // 1-based line in the source file, 0 when created in memory

  const std::string* attr(std::string_view key) const;
  bool has(std::string_view key) const { return attr(key) != nullptr; }
  /// Sets (in place when present, else appended).
  void set(std::string_view key, std::string value);
  /// Sets only when absent (NCCL's xmlInitAttr*).
  void setIfUnset(std::string_view key, std::string value);
  void unset(std::string_view key);
  XmlNode* addChild(std::string name);
  /// First direct child with that name (optionally with attribute key == value).
  XmlNode* child(std::string_view name) const;
  XmlNode* childWith(std::string_view name, std::string_view key, std::string_view value) const;
  /// Removes `sub` from this node's children and returns it.
  std::unique_ptr<XmlNode> removeChild(const XmlNode* sub);
  std::unique_ptr<XmlNode> clone(XmlNode* newParent = nullptr) const;
  /// Depth-first (document order) search below and including this node.
  XmlNode* find(std::string_view name);
  XmlNode* findWith(std::string_view name, std::string_view key, std::string_view value);
  template <typename F>
  void visit(F&& f) {
    f(*this);
    for (auto& s : subs) s->visit(f);
  }
};

/// A loaded document: a root element plus the file name used in error messages.
struct XmlDoc {
  std::unique_ptr<XmlNode> root;
  std::string source;  // file name, or "<string>"

  XmlDoc clone() const;
  /// "file:line" for messages about `node`.
  std::string where(const XmlNode& node) const;
};

/// Parses a topology or graph XML. Throws Error(kInvalidArgument) naming file and line on malformed input,
/// Error(kNotFound/kSystemError) when the file is missing or unreadable.
XmlDoc loadXmlFile(const std::string& path);
XmlDoc parseXml(std::string_view text, const std::string& source = "<string>");

/// Writes the canonical NCCL form.
std::string toString(const XmlNode& root);
void writeXmlFile(const std::string& path, const XmlNode& root);

/// NCCL's topology trimming (ncclTopoTrimXml): removes pci/cpu/nic/net branches that contain no element
/// carrying keep="1", and strips the keep attributes of the kept ones.
void trimXml(XmlNode& root);

/// NCCL's topology fusion (ncclTopoFuseXml): merges `src`'s <system> into `dst`'s, matching elements by name
/// and identical attribute sets, appending what is new.
void fuseXml(XmlNode& dst, const XmlNode& src);

}  // namespace topocoll::topology
