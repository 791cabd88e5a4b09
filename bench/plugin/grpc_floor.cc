// The resident-memory floor under the device plugin: a process that only starts a gRPC server on a
// unix socket (no service, no plugin code) with Debian's shared gRPC, then sleeps until killed.
// plugin_bench's BM_FloorRss starts it and reads its VmRSS the same way as the agent's, so the
// plugin's figure can be read as "floor + what gpulet adds". Built twice: grpc_floor (gRPC only)
// and grpc_httplib_floor (also linked with cpp-httplib, whose library initialises OpenSSL when
// loaded; the agent needs it for the Kubernetes API client and the metrics endpoint).
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <memory>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(std::string("unix://") + argv[1], grpc::InsecureServerCredentials());
  grpc::CallbackGenericService unimplemented;  // a server needs one service to start
  builder.RegisterCallbackGenericService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return 1;
  pause();
}
