// The built-in transports, in registry order.
#pragma once

#include "topocoll/transport/transport.h"

namespace topocoll::transport {

const Transport& p2pTransport();
const Transport& shmTransport();
const Transport& netTransport();

}  // namespace topocoll::transport
