// Compiled as part of the topology layer (tests/CMakeLists.txt: target layering_violation, never built by default).
// The topology layer sits below search, so this include must not resolve: the build has to fail here.
#include "topocoll/search/graph.h"

int layeringViolation() { return 0; }
