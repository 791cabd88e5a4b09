// gpulet-container-runtime: the OCI runtime shim (see runtime/shim.h). Only wiring here.
#include "runtime/shim.h"

int main(int argc, char** argv) { return gpulet::runtime::ShimMain(argc, argv); }
