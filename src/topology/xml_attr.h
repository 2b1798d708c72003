// Strict attribute readers for topology XML: every failure names file:line, element and attribute.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <string>

#include "topocoll/status.h"
#include "topocoll/topology/xml.h"

namespace topocoll::topology {

class AttrReader {
 public:
  explicit AttrReader(const XmlDoc& doc) : doc_(doc) {}

  const std::string& reqStr(const XmlNode& x, const char* key) const {
    const std::string* v = x.attr(key);
    if (!v) fail(StatusCode::kInvalidArgument, "{}: <{}> is missing required attribute '{}'", doc_.where(x), x.name, key);
    return *v;
  }
  // Integers follow strtol(..., 0): decimal, 0x hex, leading-0 octal; the whole value must parse.
  long long parseInt(const XmlNode& x, const char* key, const std::string& s) const {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 0);
    if (s.empty() || errno != 0 || *end != '\0' || v < INT32_MIN || v > INT32_MAX)
      fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is not an integer", doc_.where(x), x.name, key, s);
    return v;
  }
  int reqInt(const XmlNode& x, const char* key) const { return static_cast<int>(parseInt(x, key, reqStr(x, key))); }
  int optInt(const XmlNode& x, const char* key, int def, bool emptyIsDefault = false) const {
    const std::string* v = x.attr(key);
    if (!v) return def;
    if (v->empty() && emptyIsDefault) return def;
    return static_cast<int>(parseInt(x, key, *v));
  }
  float optFloat(const XmlNode& x, const char* key, float def) const {
    const std::string* v = x.attr(key);
    if (!v) return def;
    errno = 0;
    char* end = nullptr;
    float f = std::strtof(v->c_str(), &end);
    if (v->empty() || errno != 0 || *end != '\0')
      fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is not a number", doc_.where(x), x.name, key, *v);
    return f;
  }
  uint64_t hexOrInt(const XmlNode& x, const char* key, const std::string& s) const {
    errno = 0;
    char* end = nullptr;
    unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (s.empty() || errno != 0 || *end != '\0' || v > 0xffff)
      fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is not a 16-bit PCI id", doc_.where(x), x.name,
           key, s);
    return v;
  }
  void checkBusId(const XmlNode& x, const std::string& s) const {
    bool ok = !s.empty();
    for (char c : s)
      if (!(isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')) ok = false;
    if (!ok) fail(StatusCode::kInvalidArgument, "{}: busid=\"{}\" is not a PCI bus id (like 0000:65:00.0)", doc_.where(x), s);
  }

 private:
  const XmlDoc& doc_;
};

}  // namespace topocoll::topology
