#include "fake_nvml/control.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/status.h"
#include "fake_nvml/machine.h"

namespace gpulet::sim {
namespace {

constexpr std::pair<Fault::Kind, const char*> kKinds[] = {{Fault::Kind::kXid, "xid"},
                                                          {Fault::Kind::kEcc, "ecc"},
                                                          {Fault::Kind::kLost, "lost"},
                                                          {Fault::Kind::kReset, "reset"},
                                                          {Fault::Kind::kNvmlFail, "nvml-fail"},
                                                          {Fault::Kind::kNvmlOk, "nvml-ok"},
                                                          {Fault::Kind::kSet, "set"}};

bool NeedsGpu(Fault::Kind k) { return k != Fault::Kind::kNvmlFail && k != Fault::Kind::kNvmlOk; }

}  // namespace

std::string ControlLogPath(const std::string& sim_root) { return sim_root + "/control/faults.log"; }
std::string NodeFilePath(const std::string& sim_root) { return sim_root + "/control/node"; }

std::string FormatFault(const Fault& f) {
  std::string out;
  for (auto [k, name] : kKinds) {
    if (k == f.kind) out = name;
  }
  if (NeedsGpu(f.kind)) absl::StrAppend(&out, " gpu=", f.gpu);
  if (f.kind == Fault::Kind::kXid) absl::StrAppend(&out, " code=", f.code);
  if (f.kind == Fault::Kind::kEcc) absl::StrAppend(&out, " type=", f.double_bit ? "dbe" : "sbe");
  if (f.gi >= 0) absl::StrAppend(&out, " gi=", f.gi);
  if (f.ci >= 0) absl::StrAppend(&out, " ci=", f.ci);
  for (const auto& [k, v] : f.values) absl::StrAppend(&out, " ", k, "=", v);
  return out;
}

absl::StatusOr<Fault> ParseFault(absl::string_view line) {
  std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.empty()) return absl::InvalidArgumentError("empty fault");
  Fault f;
  bool known = false;
  for (auto [k, name] : kKinds) {
    if (words[0] == name) f.kind = k, known = true;
  }
  if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown fault '", words[0], "'"));
  const auto& keys = TelemetryKeys();
  for (size_t i = 1; i < words.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(words[i], '=');
    std::string key(kv.first);
    if (f.kind == Fault::Kind::kEcc && key == "type") {
      if (kv.second != "sbe" && kv.second != "dbe") {
        return absl::InvalidArgumentError(
            absl::StrCat("ecc type must be sbe or dbe, not '", kv.second, "'"));
      }
      f.double_bit = kv.second == "dbe";
      continue;
    }
    uint64_t v = 0;
    if (!absl::SimpleAtoi(kv.second, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value in '", words[i], "' (want key=integer)"));
    }
    if (key == "gpu") {
      f.gpu = static_cast<int>(std::min<uint64_t>(v, 1 << 20));
    } else if (key == "code" && f.kind == Fault::Kind::kXid) {
      f.code = v;
    } else if (key == "gi" && f.kind == Fault::Kind::kXid) {
      f.gi = static_cast<int64_t>(std::min<uint64_t>(v, 1 << 20));
    } else if (key == "ci" && f.kind == Fault::Kind::kXid) {
      f.ci = static_cast<int64_t>(std::min<uint64_t>(v, 1 << 20));
    } else if (f.kind == Fault::Kind::kSet &&
               std::find(keys.begin(), keys.end(), key) != keys.end()) {
      f.values.emplace_back(key, v);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown field '", key, "' for fault '", words[0], "'"));
    }
  }
  if (NeedsGpu(f.kind) && f.gpu < 0) return absl::InvalidArgumentError("missing gpu=N");
  if (f.kind == Fault::Kind::kXid && f.code == 0)
    return absl::InvalidArgumentError("missing code=XID");
  if (f.kind == Fault::Kind::kSet && f.values.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("set needs at least one of: ", absl::StrJoin(keys, ", ")));
  }
  return f;
}

namespace {

// An XID aimed at a MIG device (--gi/--ci) must name one the GPU has: on a GPU without MIG the
// event used to reach the agent as a whole-GPU XID, which is not what was asked for.
absl::Status CheckMigDevice(const std::string& sim_root, const std::string& node, const Fault& f) {
  if (f.gi < 0) {
    return absl::InvalidArgumentError(
        "--ci needs --gi: a compute instance lives in a GPU instance");
  }
  for (absl::string_view line : absl::StrSplit(node, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int gpu = -1;
    if (w.size() < 2 || w[0] != "mig" || !absl::SimpleAtoi(w[1], &gpu) || gpu != f.gpu) continue;
    for (size_t i = 2; i < w.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> ids = absl::StrSplit(w[i], ':');
      if (ids.first == absl::StrCat(f.gi) && (f.ci < 0 || ids.second == absl::StrCat(f.ci)))
        return absl::OkStatus();
    }
    std::vector<absl::string_view> have(w.begin() + 2, w.end());
    return absl::NotFoundError(absl::StrCat(
        "GPU ", f.gpu, " has no MIG device gi=", f.gi, f.ci >= 0 ? absl::StrCat(" ci=", f.ci) : "",
        " (its MIG devices, gi:ci: ", have.empty() ? "none" : absl::StrJoin(have, " "), ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "GPU ", f.gpu, " of the simulated node at ", sim_root,
      " does not have MIG enabled: --gi/--ci name a MIG device; without them the XID is on the "
      "whole GPU"));
}

}  // namespace

absl::Status InjectFault(const std::string& sim_root, const Fault& f) {
  std::string line = FormatFault(f);
  // Round-trip through the parser: what we write is exactly what every reader will accept.
  auto parsed = ParseFault(line);
  if (!parsed.ok()) return parsed.status();
  auto node = ReadFileToString(NodeFilePath(sim_root));
  if (!node.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no simulated node at ", sim_root, " (", NodeFilePath(sim_root),
                     " is missing; start one with --simulate PROFILE --sim-root ", sim_root, ")"));
  }
  int gpus = 0;
  std::vector<absl::string_view> w =
      absl::StrSplit(*node, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  if (w.size() < 2 || w[0] != "gpus" || !absl::SimpleAtoi(w[1], &gpus)) {
    return absl::DataLossError(absl::StrCat(NodeFilePath(sim_root), ": unreadable node file"));
  }
  if (NeedsGpu(f.kind) && f.gpu >= gpus) {
    return absl::OutOfRangeError(absl::StrCat("no GPU ", f.gpu, " on the simulated node at ",
                                              sim_root, " (it has GPUs 0..", gpus - 1, ")"));
  }
  if (f.gi >= 0 || f.ci >= 0) RETURN_IF_ERROR(CheckMigDevice(sim_root, *node, f));
  line += '\n';
  std::string path = ControlLogPath(sim_root);
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  ssize_t n = ::write(fd, line.data(), line.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) {
    return absl::InternalError(absl::StrCat("cannot append to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace gpulet::sim
