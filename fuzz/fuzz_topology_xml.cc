// libFuzzer target: any byte string through the XML loader, the system builder, paths and the whole plan.
// Only topocoll::Error may escape the library; anything else (crash, hang, sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "topocoll/plan.h"
#include "topocoll/status.h"
#include "topocoll/topology/xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll;
  try {
    auto doc = topology::parseXml(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.xml");
    auto text = topology::toString(*doc.root);
    (void)topology::parseXml(text, "again.xml");
    Config cfg;
    cfg.searchTimeoutScale = 1;
    auto plan = makePlan(doc, JobSpec{2, 0, {}}, cfg);
    (void)plan.select(tuning::kAllReduce, 1 << 20);
  } catch (const Error&) {
  }
  return 0;
}
