// A stand-in for libnvidia-ml.so, loaded by discovery tests through DiscoveryOptions::nvmlLibrary: it reports the
// GPUs and NVLinks listed in the file named by FAKE_NVML_CONFIG, one per line:
//   gpu <busId as NVML prints it> <cc major> <cc minor>
//   nvlink <gpu index> <remote busId, or - for an invisible one>     (one active link each)
//   width <gpu index> <current PCIe link width>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Gpu {
  std::string busId;
  int major = 0, minor = 0;
  unsigned width = 0;
  std::vector<std::string> links;
};
std::vector<Gpu> gpus;

struct PciInfo {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

Gpu* of(void* dev) {
  size_t i = reinterpret_cast<size_t>(dev) - 1;
  return i < gpus.size() ? &gpus[i] : nullptr;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  gpus.clear();
  const char* path = std::getenv("FAKE_NVML_CONFIG");
  if (!path) return 1;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string kind;
    ss >> kind;
    if (kind == "gpu") {
      Gpu g;
      ss >> g.busId >> g.major >> g.minor;
      gpus.push_back(g);
    } else if (kind == "nvlink") {
      size_t i;
      std::string target;
      ss >> i >> target;
      gpus.at(i).links.push_back(target == "-" ? "" : target);
    } else if (kind == "width") {
      size_t i;
      ss >> i;
      ss >> gpus.at(i).width;
    }
  }
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = static_cast<unsigned>(gpus.size());
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** dev) {
  if (i >= gpus.size()) return 2;
  *dev = reinterpret_cast<void*>(static_cast<size_t>(i) + 1);
  return 0;
}

int nvmlDeviceGetPciInfo_v3(void* dev, PciInfo* info) {
  Gpu* g = of(dev);
  if (!g) return 2;
  std::memset(info, 0, sizeof(*info));
  std::snprintf(info->busId, sizeof(info->busId), "%s", g->busId.c_str());
  return 0;
}

int nvmlDeviceGetCudaComputeCapability(void* dev, int* major, int* minor) {
  Gpu* g = of(dev);
  if (!g) return 2;
  *major = g->major;
  *minor = g->minor;
  return 0;
}

int nvmlDeviceGetNvLinkState(void* dev, unsigned link, int* active) {
  Gpu* g = of(dev);
  if (!g) return 2;
  *active = link < g->links.size() ? 1 : 0;
  return 0;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* dev, unsigned link, PciInfo* info) {
  Gpu* g = of(dev);
  if (!g || link >= g->links.size()) return 2;
  std::memset(info, 0, sizeof(*info));
  std::snprintf(info->busId, sizeof(info->busId), "%s", g->links[link].c_str());
  return 0;
}

int nvmlDeviceGetCurrPcieLinkWidth(void* dev, unsigned* width) {
  Gpu* g = of(dev);
  if (!g || g->width == 0) return 3;  // NVML_ERROR_NOT_SUPPORTED
  *width = g->width;
  return 0;
}

}  // extern "C"
