// gRPC's own log lines ("E1128 12:00:00 chttp2_server.cc:1051] {...errno 13...}") are a second
// voice beside gpulet's: each failure they report is reported by gpulet too, in its voice, with
// the reason (common/net.h). Routed here into spdlog at debug level, so they stay reachable.
#pragma once

namespace gpulet::kubelet {

// Before any gRPC object exists (main()).
void RouteGrpcLogsToDebug();

}  // namespace gpulet::kubelet
