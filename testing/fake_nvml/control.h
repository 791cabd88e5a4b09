// Live fault injection into a running simulated node. Faults are appended, one line each, to the
// node's control log (<sim_root>/control/faults.log); every process that has the fake NVML loaded
// for that sim root polls the log (one stat() per NVML call, and every few ms inside
// nvmlEventSetWait) and applies new lines. State faults (lost, reset, nvml-fail/ok, set, ECC
// counts) are replayed by processes that start later; events (XID, ECC) reach only processes
// already running. Writers append with O_APPEND in a single write(), so concurrent writers never
// interleave.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpulet::sim {

struct Fault {
  enum class Kind { kXid, kEcc, kLost, kReset, kNvmlFail, kNvmlOk, kSet };
  Kind kind = Kind::kXid;
  int gpu = -1;              // NVML index; unused by kNvmlFail / kNvmlOk
  uint64_t code = 0;         // kXid: the XID
  bool double_bit = false;   // kEcc: double-bit (uncorrectable) instead of single-bit
  int64_t gi = -1, ci = -1;  // kXid on a MIG device: its GPU / compute instance ids
  std::vector<std::pair<std::string, uint64_t>> values;  // kSet: TelemetryKeys() = value
};

// "<sim_root>/control/faults.log"
std::string ControlLogPath(const std::string& sim_root);
// "<sim_root>/control/node": written by the fake at nvmlInit ("gpus N"), so writers can check
// that a node lives there and that a GPU index exists.
std::string NodeFilePath(const std::string& sim_root);

std::string FormatFault(const Fault& f);  // one line, without '\n'
absl::StatusOr<Fault> ParseFault(absl::string_view line);

// Validates `f` against the node at `sim_root` and appends it to its control log.
absl::Status InjectFault(const std::string& sim_root, const Fault& f);

}  // namespace gpulet::sim
