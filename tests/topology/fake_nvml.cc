// A stand-in for libnvidia-ml.so and the few calls of libcuda.so discovery makes, loaded by discovery tests through
// DiscoveryOptions::nvmlLibrary and ::cudaLibrary: it reports the GPUs and NVLinks listed in the file named by
// FAKE_NVML_CONFIG, one per line:
//   gpu <busId as NVML prints it> <cc major> <cc minor>
//   nvlink <gpu index> <remote busId, or - for an invisible one>     (one active link each)
//   width <gpu index> <current PCIe link width>
//   gen <gpu index> <current PCIe link generation>
//   gdr <gpu index> <0|1>     (CUDA's GPU Direct RDMA attribute; without it the attribute query fails)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Gpu {
  std::string busId;
  int major = 0, minor = 0;
  unsigned width = 0, gen = 0;
  int gdr = -1;
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
    } else if (kind == "gen") {
      size_t i;
      ss >> i;
      ss >> gpus.at(i).gen;
    } else if (kind == "gdr") {
      size_t i;
      ss >> i;
      ss >> gpus.at(i).gdr;
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

int nvmlDeviceGetCurrPcieLinkGeneration(void* dev, unsigned* gen) {
  Gpu* g = of(dev);
  if (!g || g->gen == 0) return 3;
  *gen = g->gen;
  return 0;
}

int cuInit(unsigned) { return nvmlInit_v2() == 0 ? 0 : 3; }  // CUDA_ERROR_NOT_INITIALIZED

int cuDeviceGetByPCIBusId(int* dev, const char* busId) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string& b = gpus[i].busId;  // "00000000:06:00.0" matches "0000:06:00.0", in any case
    std::string want = busId;
    if (b.size() < want.size() || strcasecmp(b.c_str() + b.size() - want.size(), want.c_str()) != 0) continue;
    *dev = static_cast<int>(i);
    return 0;
  }
  return 101;  // CUDA_ERROR_INVALID_DEVICE
}

int cuDeviceGetAttribute(int* value, int attribute, int dev) {
  if (dev < 0 || static_cast<size_t>(dev) >= gpus.size() || attribute != 116 || gpus[dev].gdr < 0) return 1;
  *value = gpus[dev].gdr;
  return 0;
}

}  // extern "C"
