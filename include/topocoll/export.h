// What libtopocoll.so exports. The layers are compiled with hidden visibility (cmake/layers.cmake), so the shared
// library shows only what carries TOPOCOLL_API: the C API of topocoll.h and the C++ classes and functions a program
// calls (runtime::Communicator and what it takes and returns, the planner's front door, Error). Static links and the
// tests see everything, as before. tests/install/exported_symbols.sh lists what the library exports.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TOPOCOLL_API __attribute__((visibility("default")))
#else
#define TOPOCOLL_API
#endif
