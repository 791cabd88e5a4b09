// How many malloc arenas glibc has made in this process (the <heap nr="N"> elements of
// malloc_info's XML). Arenas are never freed; each holds the memory its threads freed. Used by
// bench/gpu/nvml_rss (NVML's threads) and the exporter's malloc-settings test.
#pragma once

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

#include <cstring>

namespace gpulet::sim {

inline int MallocArenas() {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return -1;
  malloc_info(0, f);
  fclose(f);
  int n = 0;
  for (const char* p = buf; (p = std::strstr(p, "<heap nr=")) != nullptr; ++p) ++n;
  free(buf);
  return n;
}

}  // namespace gpulet::sim
