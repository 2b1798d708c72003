// The positive control of layering_test.sh: the topology layer sees its own headers and common's.
#include "topocoll/status.h"
#include "topocoll/topology/system.h"

int layeringOk() { return 0; }
