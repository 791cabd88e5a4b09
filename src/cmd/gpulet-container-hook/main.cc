// gpulet-container-hook: the OCI hook (see runtime/hook.h). Only wiring here.
#include "runtime/hook.h"

int main(int argc, char** argv) { return gpulet::runtime::HookMain(argc, argv); }
