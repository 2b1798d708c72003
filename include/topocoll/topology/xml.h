// NCCL's topology/graph XML format: a lossless in-memory tree, the loader and the writer.
//
// Canonical form (what `toString` writes and what NCCL_TOPO_DUMP_FILE contains): one element per line,
// two-space indentation, attributes in their original order as `key="value"`, childless elements closed
// with `/>`, no XML declaration, comments or text. Loading then writing a canonical file reproduces it byte
// for byte; unknown elements and attributes are kept.
#pragma once

#include "topocoll/export.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
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
struct TOPOCOLL_API XmlDoc {
  std::unique_ptr<XmlNode> root;
  std::string source;  // file name, or "<string>"

  XmlDoc clone() const;
  /// "file:line" for messages about `node`.
  std::string where(const XmlNode& node) const;
};

/// The largest topology or graph file loaded (NCCL's own XML parser stops far earlier, at 256 elements).
constexpr uint64_t kMaxXmlFileBytes = 64ull << 20;

/// Parses a topology or graph XML. Throws Error(kInvalidArgument) naming file and line on malformed input, and on
/// a directory, a device or pipe, or a file over kMaxXmlFileBytes; Error(kNotFound/kSystemError) when the file
/// is missing or unreadable.
TOPOCOLL_API XmlDoc loadXmlFile(const std::string& path);
TOPOCOLL_API XmlDoc parseXml(std::string_view text, const std::string& source = "<string>");

/// The document's root when it is a topology's <system>. Throws Error(kInvalidArgument) naming the file otherwise
/// ("this is a graph file, use --graph-in" for a <graphs> root).
XmlNode& systemElement(const XmlDoc& doc);

/// Writes the canonical NCCL form.
std::string toString(const XmlNode& root);
void writeXmlFile(const std::string& path, const XmlNode& root);

/// NCCL's topology trimming (ncclTopoTrimXml): removes pci/cpu/nic/net branches that contain no element
/// carrying keep="1", and strips the keep attributes of the kept ones.
void trimXml(XmlNode& root);

/// NCCL's topology fusion (ncclTopoFuseXml): merges `src`'s <system> into `dst`'s, matching elements by name
/// and identical attribute sets, appending what is new. Linear in the sizes of both.
void fuseXml(XmlNode& dst, const XmlNode& src);

/// Per-rank trimmed copies of one document (NCCL trims a fresh copy of the host's XML for each local rank): each
/// copy equals trimXml of a full copy in which `edit` was applied to the copy of `target`, but costs only what it
/// keeps plus a look at each child of what it keeps, not the whole document.
///
///   TrimmedCopies copies(*doc.root);
///   auto mine = copies.copy(gpu, [&](XmlNode& g) { g.set("keep", "1"); g.set("rank", "3"); });
class TrimmedCopies {
 public:
  /// `root` must outlive this object and stay unchanged.
  explicit TrimmedCopies(const XmlNode& root);
  std::unique_ptr<XmlNode> copy(const XmlNode* target, const std::function<void(XmlNode&)>& edit) const;

 private:
  struct Ctx {
    const XmlNode* target;
    const std::function<void(XmlNode&)>& edit;
    std::unordered_set<const XmlNode*> path;  // the target and its ancestors, when the target keeps
  };
  std::unique_ptr<XmlNode> shallow(const XmlNode& n, XmlNode* parent, const Ctx& ctx) const;
  std::unique_ptr<XmlNode> copyWhole(const XmlNode& n, XmlNode* parent, const Ctx& ctx) const;
  std::unique_ptr<XmlNode> copyTrimmed(const XmlNode& n, XmlNode* parent, const Ctx& ctx) const;
  const XmlNode& root_;
  std::unordered_set<const XmlNode*> holdsKeep_;  // nodes with a keep="1" element at or below them
};

}  // namespace topocoll::topology
