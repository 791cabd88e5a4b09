#include "kubelet/grpc_logs.h"

#include <grpc/support/log.h>

#include "spdlog/spdlog.h"

namespace gpulet::kubelet {

void RouteGrpcLogsToDebug() {
  gpr_set_log_function([](gpr_log_func_args* a) {
    spdlog::debug("grpc {}:{}: {}", a->file ? a->file : "?", a->line, a->message);
  });
}

}  // namespace gpulet::kubelet
