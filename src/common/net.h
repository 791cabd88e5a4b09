// Why a listener cannot be opened, found by trying it: the servers gpulet uses (cpp-httplib, gRPC)
// say only that they failed, and a user needs to know which of the three it was -- the address
// is in use, there is no permission, or there is no such address (or directory) -- to fix it.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace gpulet {

// OK when TCP `host`:`port` (host empty: every address) can be bound now; else FailedPrecondition
// "cannot listen on HOST:PORT: address in use (...)" and the like. Closes what it opened.
absl::Status ProbeTcpListen(const std::string& host, int port);

// After a server failed to bind TCP `host`:`port` and said only that it failed (cpp-httplib):
// Unavailable "cannot listen on HOST:PORT: <why>", the reason found by trying the bind again, or
// without a reason when that try succeeds (the port was freed in between).
absl::Status TcpListenFailed(const std::string& host, int port);

// The same for a unix socket at `path` (created and removed again; call it only where nothing
// else may be serving there, e.g. after the server failed to).
absl::Status ProbeUnixListen(const std::string& path);

}  // namespace gpulet
