// The fuzz targets of the replay build (tests/fuzz/CMakeLists.txt): each file's
// LLVMFuzzerTestOneInput under its own name, listed in a table CMake generates.
#pragma once

#include <cstddef>
#include <cstdint>

struct FuzzTarget {
  const char* name;
  int (*run)(const uint8_t* data, size_t size);
};
extern const FuzzTarget kFuzzTargets[];
extern const size_t kFuzzTargetCount;
