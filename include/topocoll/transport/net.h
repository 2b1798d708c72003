// The network plugin interface of the NET transport, shaped like NCCL's ncclNet_v8 (src/include/net.h,
// ext-net/): devices, properties, listen / connect / accept with a fixed-size handle that travels in a connect
// record, memory registration, and asynchronous isend / irecv completed by test. Closing is the destructor of each
// comm. The socket implementation (NCCL's src/transport/net_socket.cc design) is built in.
//
// An external NCCL net plugin (NCCL_NET_PLUGIN=libnccl-net-X.so exporting ncclNetPlugin_v8 or later) plugs in as
// one more implementation of this class: an adapter that dlopens the library, forwards each method to the
// plugin's C function table (listen/connect/accept/regMr/isend/irecv/test/close*), keeps the opaque comm and
// request pointers inside the NetComm / NetRequest objects, and turns ncclResult_t errors into exceptions. See
// docs/transport.md.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "topocoll/config.h"

namespace topocoll::transport {

/// NCCL_NET_HANDLE_MAXSIZE is 128; ours must also fit a connect record next to other fields.
constexpr size_t kNetHandleSize = 64;
struct NetHandle {
  uint8_t bytes[kNetHandleSize] = {};
};

/// ncclNetProperties_v8, the fields we use.
struct NetProperties {
  std::string name;     // interface name, "eth0"
  std::string pciPath;  // sysfs path of the device, empty for virtual ones
  int speedMbps = 0;
  int port = 0;
  int maxComms = 65536;
  int maxRecvs = 1;     // grouped receives are not used
};

/// A listen, send or recv comm; destroying it closes it (ncclNet closeListen / closeSend / closeRecv).
class NetComm {
 public:
  virtual ~NetComm() = default;
};
/// An outstanding isend or irecv; owned by its comm, valid until test() reports it done.
class NetRequest {
 public:
  virtual ~NetRequest() = default;
};

class Net {
 public:
  virtual ~Net() = default;
  /// NCCL's ncclNet->name: "Socket".
  virtual const char* name() const = 0;
  virtual int devices() const = 0;
  virtual NetProperties getProperties(int dev) const = 0;
  /// Listens on device `dev`; the handle goes to the peer, which connects with it.
  virtual std::unique_ptr<NetComm> listen(int dev, NetHandle* handle) = 0;
  /// Non-blocking connect: nullptr while not established yet (call again with the same `state`, which the call
  /// keeps its progress in, as NCCL's handle stage).
  virtual std::unique_ptr<NetComm> connect(int dev, const NetHandle& handle, std::unique_ptr<NetComm>* state) = 0;
  /// Non-blocking accept on a listen comm: nullptr while no peer has fully connected yet.
  virtual std::unique_ptr<NetComm> accept(NetComm& listenComm) = 0;
  /// Memory registration (no-op for sockets); returns the mhandle passed to isend / irecv.
  virtual void* regMr(NetComm& comm, void* data, size_t size) { return nullptr; }
  virtual void deregMr(NetComm& comm, void* mhandle) {}
  /// Starts sending `size` bytes; nullptr when no request is free (call again later).
  virtual NetRequest* isend(NetComm& sendComm, const void* data, size_t size, int tag, void* mhandle) = 0;
  /// Starts receiving at most `size` bytes; nullptr when no request is free.
  virtual NetRequest* irecv(NetComm& recvComm, void* data, size_t size, int tag, void* mhandle) = 0;
  /// Progresses `req`; true when done (then *size holds the bytes moved and the request is released). Throws
  /// Error(kRemoteError) when the connection broke, (kInvalidUsage) when more bytes arrive than `size`.
  virtual bool test(NetRequest* req, size_t* size) = 0;
  /// Optional: descriptors whose readiness would let pending requests of `comm` advance (so the caller can sleep).
  virtual void pollFds(NetComm& comm, std::vector<pollfd>& fds) {}
};

/// The pacing cap of one NET/Socket socket in bytes/s (its SO_MAX_PACING_RATE), 0 for none. `knob` is
/// TOPOCOLL_SOCKET_PACING: N > 0 caps at N Mbit/s, 0 leaves the kernel's pacing alone, and -1 (the default) caps at
/// 1.25x `statedMbps`, the speed the kernel states for the socket's interface, where the socket's congestion control
/// `congestion` is BBR and a speed is stated (docs/transport.md, "Pacing").
uint64_t socketPacingBytesPerSec(int knob, std::string_view congestion, int statedMbps);

/// NCCL's internal socket plugin: devices are the interfaces of NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY (the
/// bootstrap's rules, include/topocoll/netif.h); each connection has a control socket and, with
/// NCCL_SOCKET_NTHREADS helper threads, NCCL_NSOCKS_PERTHREAD data sockets per thread that each message is split
/// over. Throws Error(kInvalidArgument) when no interface matches.
std::unique_ptr<Net> makeSocketNet(const Config& cfg);

}  // namespace topocoll::transport
