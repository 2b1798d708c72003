// Strict attribute readers for topology XML: every failure names file:line, element and attribute.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
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
  // Integers follow strtol(..., 0): decimal, 0x hex, leading-0 octal; the whole value must parse, and fit [lo, hi]
  // (what NCCL's use of the value can take; by default an int).
  long long parseInt(const XmlNode& x, const char* key, const std::string& s, long long lo = INT32_MIN,
                     long long hi = INT32_MAX) const {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 0);
    if (s.empty() || end == s.c_str() || *end != '\0') {
      // "1e300" is a number, only not an integer one; "abc" is not a number at all.
      char* fend = nullptr;
      double d = std::strtod(s.c_str(), &fend);
      if (!s.empty() && *fend == '\0' && std::isfinite(d) && (d < static_cast<double>(lo) || d > static_cast<double>(hi)))
        outOfRange(x, key, s, lo, hi);
      fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is not an integer", doc_.where(x), x.name, key, s);
    }
    if (errno == ERANGE || v < lo || v > hi) outOfRange(x, key, s, lo, hi);
    return v;
  }
  int reqInt(const XmlNode& x, const char* key, long long lo = INT32_MIN, long long hi = INT32_MAX) const {
    return static_cast<int>(parseInt(x, key, reqStr(x, key), lo, hi));
  }
  int optInt(const XmlNode& x, const char* key, int def, long long lo = INT32_MIN, long long hi = INT32_MAX) const {
    const std::string* v = x.attr(key);
    if (!v) return def;
    return static_cast<int>(parseInt(x, key, *v, lo, hi));
  }
  // A finite number in [lo, hi] (NaN, infinities and overflow are refused: NCCL would compute with them).
  float optFloat(const XmlNode& x, const char* key, float def, double lo, double hi) const {
    const std::string* v = x.attr(key);
    if (!v) return def;
    errno = 0;
    char* end = nullptr;
    double f = std::strtod(v->c_str(), &end);
    if (v->empty() || end == v->c_str() || *end != '\0')
      fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is not a number", doc_.where(x), x.name, key, *v);
    if (std::isnan(f))
      fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is not a finite number", doc_.where(x), x.name,
           key, *v);
    if (errno == ERANGE || !std::isfinite(f) || f < lo || f > hi) outOfRange(x, key, *v, lo, hi);
    return static_cast<float>(f);
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
  template <typename T>
  [[noreturn]] void outOfRange(const XmlNode& x, const char* key, const std::string& s, T lo, T hi) const {
    fail(StatusCode::kInvalidArgument, "{}: <{}> attribute {}=\"{}\" is out of range [{}, {}]", doc_.where(x), x.name,
         key, s, lo, hi);
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
