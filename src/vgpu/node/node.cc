#include "vgpu/node/node.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/status.h"
#include "placement/vgpu_policy.h"
#include "spdlog/spdlog.h"

namespace gpulet::vgpu {
namespace {

using nlohmann::json;

// A grant's time (Grant::time_ns, checkpointed across restarts) is wall time from the assigner's
// Clock, in its whole seconds: the grace before a grant the kubelet or the API server does not
// show yet is released is decided on it, so a test's clock decides it too.
constexpr int64_t kNanosPerSecond = 1'000'000'000;

// A pod as listed or watched: its uid ("" when absent), and whether it has ended (Succeeded or
// Failed). Either is false/empty for a value that is not an object.
std::string PodUid(const json& pod) {
  auto md = pod.is_object() ? pod.find("metadata") : pod.end();
  if (md == pod.end() || !md->is_object()) return "";
  auto uid = md->find("uid");
  return uid != md->end() && uid->is_string() ? uid->get<std::string>() : "";
}

bool PodEnded(const json& pod) {
  auto st = pod.is_object() ? pod.find("status") : pod.end();
  if (st == pod.end() || !st->is_object()) return false;
  auto phase = st->find("phase");
  return phase != st->end() && phase->is_string() && (*phase == "Succeeded" || *phase == "Failed");
}

std::string Ann(const json& pod, const std::string& key) {
  const json& md = pod.contains("metadata") ? pod["metadata"] : json::object();
  if (!md.contains("annotations") || !md["annotations"].is_object()) return "";
  auto it = md["annotations"].find(key);
  return it != md["annotations"].end() && it->is_string() ? it->get<std::string>() : "";
}

// Device IDs "<uuid>::vc<n>" / "<uuid>::vm<n>" counted per GPU: uuid -> {core units, memory units}.
std::map<std::string, std::pair<int64_t, int64_t>> CountByGpu(const std::vector<std::string>& ids) {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (const auto& id : ids) {
    size_t sep = id.rfind("::");
    auto& n = out[sep == std::string::npos ? id : id.substr(0, sep)];
    (sep != std::string::npos && id.compare(sep + 2, 2, "vm") == 0 ? n.second : n.first)++;
  }
  return out;
}

// "GPU-a: 60 core + 20 memory, GPU-b: 40 core": what the kubelet booked, for error messages.
std::string IdSummary(const std::vector<std::string>& ids) {
  std::vector<std::string> parts;
  for (const auto& [uuid, n] : CountByGpu(ids)) {
    std::string p = uuid + ":";
    if (n.first) absl::StrAppend(&p, " ", n.first, " core");
    if (n.first && n.second) absl::StrAppend(&p, " +");
    if (n.second) absl::StrAppend(&p, " ", n.second, " memory");
    parts.push_back(p);
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

std::string Who(const std::string& ns, const std::string& pod, const std::string& container) {
  if (pod.empty()) return "a container (its pod is not known without API access)";
  return absl::StrCat("pod ", ns, "/", pod, " container ", container);
}

// The GPUs the kubelet's device IDs book for a container asking `pr` (one container), if this
// node's grants leave them free: k whole GPUs = all 100 core units of each of k GPUs (memory units
// of whole GPUs are not enforced, so where they lie does not matter); a share = every unit on one
// GPU. Empty with `reason` set otherwise.
std::vector<std::string> BookedGpus(const std::vector<std::string>& ids,
                                    const std::map<std::string, int>& index_of,
                                    const placement::Node& node, const placement::PodRequest& pr,
                                    const std::string& core_name, std::string* reason) {
  const placement::ContainerRequest& cr = pr.containers[0];
  auto by_gpu = CountByGpu(ids);
  placement::Assignment a;
  a.containers.resize(1);
  std::vector<std::string> gpus;
  for (const auto& [uuid, n] : by_gpu) {
    if (!index_of.count(uuid)) {
      *reason = absl::StrCat(uuid, " is not a vGPU GPU of this node");
      return {};
    }
  }
  if (cr.whole_gpus > 0) {
    bool all_units = true;
    for (const auto& [uuid, n] : by_gpu) {
      if (n.first == 0) continue;
      gpus.push_back(uuid);
      all_units = all_units && n.first == kCoresPerGpu;
    }
    if (!all_units || static_cast<int32_t>(gpus.size()) != cr.whole_gpus) {
      *reason = absl::StrCat("a whole GPU needs all ", kCoresPerGpu, " ", core_name,
                             " units of one GPU; the kubelet booked ", IdSummary(ids),
                             " (no GPU of this node had all its units free?)");
      return {};
    }
    for (const auto& u : gpus) a.containers[0].gpus.push_back(index_of.at(u));
    a.containers[0].milli = placement::kMilliPerGpu;
    a.containers[0].memory_bytes = node.gpus[a.containers[0].gpus[0]].memory_total_bytes;
  } else {
    if (by_gpu.size() != 1) {
      *reason = absl::StrCat("a share must lie on one GPU; the kubelet booked ", IdSummary(ids));
      return {};
    }
    gpus = {by_gpu.begin()->first};
    a.containers[0].gpus = {index_of.at(gpus[0])};
    a.containers[0].milli = cr.milli;
    a.containers[0].memory_bytes = cr.memory_bytes;
  }
  placement::Node trial = node;
  if (absl::Status s = placement::Apply(trial, pr, a); !s.ok()) {
    *reason =
        absl::StrCat("the kubelet booked ", IdSummary(ids), ", but ", absl::StrJoin(gpus, ","),
                     " is not free in this node's grants (", s.message(), ")");
    return {};
  }
  return gpus;
}

// The user and group a container runs as, from its securityContext or the pod's; -1 unknown.
std::pair<int64_t, int64_t> RunAs(const json& pod, int index) {
  int64_t uid = -1, gid = -1;
  auto take = [&](const json* sc) {
    if (!sc || !sc->is_object()) return;
    auto u = sc->find("runAsUser"), g = sc->find("runAsGroup");
    if (uid < 0 && u != sc->end() && u->is_number_unsigned() && *u <= 0x7fffffffu) uid = *u;
    if (gid < 0 && g != sc->end() && g->is_number_unsigned() && *g <= 0x7fffffffu) gid = *g;
  };
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return {-1, -1};
  auto cs = spec->find("containers");
  if (cs != spec->end() && cs->is_array() && index >= 0 &&
      static_cast<size_t>(index) < cs->size()) {
    const json& c = (*cs)[index];
    if (c.is_object() && c.contains("securityContext")) take(&c["securityContext"]);
  }
  if (auto sc = spec->find("securityContext"); sc != spec->end()) take(&*sc);
  return {uid, gid};
}

json GrantToJson(const Grant& g) {
  return {{"podUID", g.pod_uid},
          {"namespace", g.ns},
          {"pod", g.pod},
          {"container", g.container},
          {"index", g.container_index},
          {"gpus", g.gpus},
          {"cores", g.cores},
          {"memoryUnits", g.memory_units},
          {"ceiling", g.ceiling},
          {"deviceIDs", g.device_ids},
          {"accountingDir", g.accounting_dir},
          {"inject", g.inject},
          {"time", g.time_ns}};
}

// One checkpointed grant, every field type-checked and bounded: the file is ours, but a
// hand edit or a bad disk must give a message naming the grant and field, never an exception
// that aborts the agent at every start.
absl::StatusOr<Grant> GrantFromJson(const json& j, size_t n) {
  auto bad = [&](const char* field, const char* want) {
    return absl::DataLossError(absl::StrCat("grant #", n, ": \"", field, "\" must be ", want));
  };
  if (!j.is_object()) return absl::DataLossError(absl::StrCat("grant #", n, " is not an object"));
  Grant g;
  auto str = [&](const char* key, std::string* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    if (!it->is_string()) return bad(key, "a string");
    *out = it->get<std::string>();
    return absl::OkStatus();
  };
  auto num = [&](const char* key, int64_t max, int64_t* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > max)
      return bad(key, absl::StrCat("an integer 0..", max).c_str());
    *out = it->get<int64_t>();
    return absl::OkStatus();
  };
  auto strings = [&](const char* key, size_t max, std::vector<std::string>* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    if (!it->is_array() || it->size() > max) return bad(key, "a short list of strings");
    for (const auto& v : *it) {
      if (!v.is_string()) return bad(key, "a list of strings");
      out->push_back(v.get<std::string>());
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(str("podUID", &g.pod_uid));
  RETURN_IF_ERROR(str("namespace", &g.ns));
  RETURN_IF_ERROR(str("pod", &g.pod));
  RETURN_IF_ERROR(str("container", &g.container));
  RETURN_IF_ERROR(str("accountingDir", &g.accounting_dir));
  int64_t index = 0;
  RETURN_IF_ERROR(num("index", 1 << 16, &index));
  g.container_index = static_cast<int>(index);
  // A node has at most a few dozen GPUs: 100 cores each, memory units of the largest GPUs.
  RETURN_IF_ERROR(num("cores", 100 * 1024, &g.cores));
  RETURN_IF_ERROR(num("memoryUnits", int64_t{1} << 32, &g.memory_units));
  RETURN_IF_ERROR(num("ceiling", 100, &g.ceiling));
  RETURN_IF_ERROR(num("time", INT64_MAX, &g.time_ns));
  RETURN_IF_ERROR(strings("gpus", 1024, &g.gpus));
  RETURN_IF_ERROR(strings("deviceIDs", 1 << 20, &g.device_ids));
  if (auto it = j.find("inject"); it != j.end()) {
    if (!it->is_boolean()) return bad("inject", "true or false");
    g.inject = it->get<bool>();
  }
  return g;
}

}  // namespace

absl::StatusOr<std::vector<PoolGpu>> PoolGpus(const gpu::Inventory& inv,
                                              const std::string& selection, bool nominal_memory) {
  std::vector<PoolGpu> out;
  auto add = [&](const gpu::Device& d) {
    PoolGpu p;
    p.uuid = d.uuid;
    p.index = d.index;
    p.memory_units =
        nominal_memory ? NominalMemoryUnitsOf(d.memory_bytes) : MemoryUnitsOf(d.memory_bytes);
    out.push_back(p);
  };
  if (selection.empty()) return out;
  if (selection == "all") {
    for (const auto& d : inv.devices) {
      if (!d.mig_enabled && d.Readable()) add(d);
    }
    return out;
  }
  for (auto part : absl::StrSplit(selection, ',', absl::SkipWhitespace())) {
    std::string item(absl::StripAsciiWhitespace(part));
    uint32_t idx = 0;
    bool by_index = absl::SimpleAtoi(item, &idx);
    const gpu::Device* found = nullptr;
    for (const auto& d : inv.devices) {
      if (d.Readable() && ((by_index && d.index == idx) || (!by_index && d.uuid == item)))
        found = &d;
    }
    if (!found) {
      return absl::NotFoundError(absl::StrCat("vGPU GPU \"", item, "\" is not on this node"));
    }
    if (found->mig_enabled) {
      return absl::InvalidArgumentError(
          absl::StrCat("vGPU GPU \"", item, "\" has MIG enabled; MIG GPUs cannot be shared"));
    }
    add(*found);
  }
  return out;
}

NodeAssigner::NodeAssigner(NodeOptions options, std::vector<PoolGpu> pool, k8s::Client* api,
                           Clock* clock)
    : options_(std::move(options)), pool_(std::move(pool)), api_(api), clock_(clock) {}

absl::StatusOr<std::vector<Grant>> ReadGrantCheckpoint(const std::string& state_dir) {
  std::string path = state_dir + "/assignments.json";
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status()) || !PathExists(path)) return std::vector<Grant>{};
    return text.status();
  }
  json j = json::parse(*text, nullptr, false);  // no exceptions: a parse error is `discarded`
  auto list = j.is_object() ? j.find("grants") : j.end();
  if (!j.is_object() || list == j.end() || !list->is_array()) {
    return absl::DataLossError(absl::StrCat(path, ": not a gpulet vGPU checkpoint"));
  }
  std::vector<Grant> loaded;
  try {
    for (size_t i = 0; i < list->size(); ++i) {
      absl::StatusOr<Grant> g = GrantFromJson((*list)[i], i);
      if (!g.ok()) return absl::DataLossError(absl::StrCat(path, ": ", g.status().message()));
      loaded.push_back(*std::move(g));
    }
  } catch (const json::exception& e) {  // belt and braces: nothing above should throw
    return absl::DataLossError(JsonErrorText(path, e.what()));
  }
  return loaded;
}

absl::Status NodeAssigner::Load() {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(grants_, ReadGrantCheckpoint(options_.state_dir));
  return absl::OkStatus();
}

absl::Status NodeAssigner::SaveLocked() {
  json list = json::array();
  for (const auto& g : grants_) list.push_back(GrantToJson(g));
  RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  return WriteFileAtomic(options_.state_dir + "/assignments.json",
                         json{{"version", 1}, {"grants", list}}.dump(1), 0600);
}

std::vector<Grant> NodeAssigner::grants() const {
  absl::MutexLock l(&mu_);
  return grants_;
}

absl::StatusOr<std::vector<NodeAssigner::Candidate>> NodeAssigner::CandidatesLocked(
    bool started_too) {
  std::vector<Candidate> out;
  if (!api_) return out;
  ASSIGN_OR_RETURN(json pods,
                   api_->ListPods("", {.field_selector = absl::StrCat(
                                           "spec.nodeName=", options_.node_name,
                                           started_too ? "" : ",status.phase=Pending")}));
  for (const json& pod : pods["items"]) {
    if (PodEnded(pod)) continue;
    auto req = ParsePod(pod, options_.names, 0);
    if (!req.ok() || req->empty()) continue;
    const json& md = pod["metadata"];
    std::string uid = md.value("uid", "");
    int64_t order = 0;
    if (!absl::SimpleAtoi(Ann(pod, kAnnotationBindTime), &order)) {
      absl::Time t;
      std::string err;
      if (absl::ParseTime(absl::RFC3339_full, md.value("creationTimestamp", ""), &t, &err)) {
        order = absl::ToUnixNanos(t);
      }
    }
    bool annotated = Ann(pod, kAnnotationNode) == options_.node_name;
    bool pod_disable =
        Ann(pod, "gpulet.io/vgpu-disable") == "1" || Ann(pod, "gpulet.io/vgpu-disable") == "true";
    int64_t soft = 0;
    absl::SimpleAtoi(Ann(pod, kAnnotationCoreLimit), &soft);
    for (const auto& c : req->containers) {
      bool served = std::any_of(grants_.begin(), grants_.end(), [&](const Grant& g) {
        return g.pod_uid == uid && g.container_index == c.index;
      });
      if (served) continue;
      Candidate cand;
      cand.uid = uid;
      cand.ns = md.value("namespace", "");
      cand.pod = md.value("name", "");
      cand.container = c.name;
      cand.index = c.index;
      cand.cores = c.cores;
      cand.memory_units = c.memory_units;
      cand.ceiling = c.fractional() ? std::clamp<int64_t>(soft, c.cores, 100) : 100;
      cand.order = order;
      if (annotated) {
        for (auto u : absl::StrSplit(Ann(pod, absl::StrCat(kAnnotationGpusPrefix, c.index)), ',',
                                     absl::SkipEmpty())) {
          cand.annotated_gpus.emplace_back(u);
        }
      }
      cand.inject = c.fractional() && !pod_disable;
      const json& spec_c = pod["spec"]["containers"][c.index];
      if (spec_c.contains("env") && spec_c["env"].is_array()) {
        for (const auto& e : spec_c["env"]) {
          if (e.value("name", "") == kVarDisable &&
              (e.value("value", "") == "1" || e.value("value", "") == "true")) {
            cand.inject = false;
          }
        }
      }
      cand.pod_json = pod;
      out.push_back(std::move(cand));
    }
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.order, a.ns, a.pod, a.index) < std::tie(b.order, b.ns, b.pod, b.index);
  });
  return out;
}

absl::StatusOr<Grant> NodeAssigner::GrantLocked(int64_t cores, int64_t memory_units,
                                                std::vector<std::string> ids) {
  // The rules of docs/vgpu.md, also where no pod was parsed (no API server: the kubelet's counts
  // are the whole request). A refused request never runs, unlimited, on a GPU nobody booked.
  {
    ContainerUnits asked;
    asked.cores = cores;
    asked.memory_units = memory_units;
    int64_t max_units = 0;
    for (const auto& p : pool_) max_units = std::max(max_units, p.memory_units);
    if (absl::Status s = ValidateContainer(asked, max_units, options_.names); !s.ok()) {
      absl::string_view why = s.message();
      absl::ConsumePrefix(&why, "container \"\": ");
      return absl::InvalidArgumentError(absl::StrCat(
          "vGPU Allocate refused (", options_.names.core, " ", cores, ", ", options_.names.memory,
          " ", memory_units, ", device IDs ", IdSummary(ids), "): ", why));
    }
  }
  ASSIGN_OR_RETURN(std::vector<Candidate> cands, CandidatesLocked());
  if (!api_) {
    // No API server (a bare simulated node): the kubelet's counts are the request; the pod is
    // unknown until PodResources names it (Correct()).
    Candidate anon;
    // Unique across releases and restarts (the checkpoint keeps earlier ones).
    anon.uid = absl::StrCat("unknown-", std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count());
    anon.container = "c";
    anon.cores = cores;
    anon.memory_units = memory_units;
    anon.ceiling = cores < kCoresPerGpu ? cores : 100;
    anon.inject = cores < kCoresPerGpu;
    cands.push_back(anon);
  }
  auto it = std::find_if(cands.begin(), cands.end(), [&](const Candidate& c) {
    return c.cores == cores && c.memory_units == memory_units;
  });
  if (it == cands.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("vGPU Allocate: no Pending pod bound to node ", options_.node_name,
                     " has an unserved container asking ", options_.names.core, " ", cores, " and ",
                     options_.names.memory, " ", memory_units));
  }
  const Candidate& c = *it;
  // This node's pool as the placement library sees it, minus what is granted.
  placement::Node node;
  node.name = options_.node_name;
  std::map<std::string, int> index_of;
  for (const auto& p : pool_) {
    placement::Gpu g;
    g.memory_total_bytes = g.memory_free_bytes = MemoryUnitsToBytes(p.memory_units);
    g.healthy = p.healthy;
    index_of[p.uuid] = static_cast<int>(node.gpus.size());
    node.gpus.push_back(g);
  }
  for (const auto& g : grants_) {
    for (const auto& u : g.gpus) {
      auto gi = index_of.find(u);
      if (gi == index_of.end()) continue;
      placement::Gpu& gpu = node.gpus[gi->second];
      bool whole = g.cores >= kCoresPerGpu;
      gpu.free_milli -= whole ? placement::kMilliPerGpu : g.cores * placement::kMilliPerVcudaCore;
      gpu.memory_free_bytes -= whole ? gpu.memory_total_bytes : MemoryUnitsToBytes(g.memory_units);
    }
  }
  placement::PodRequest pr;
  pr.name = c.ns + "/" + c.pod;
  ContainerUnits asked;
  asked.cores = cores;
  asked.memory_units = memory_units;
  const placement::ContainerRequest cr = PlacementRequestOf(asked);
  pr.containers.push_back(cr);
  std::vector<std::string> gpus;
  if (!c.annotated_gpus.empty()) {
    placement::Assignment a;
    a.containers.resize(1);
    bool known = true;
    for (const auto& u : c.annotated_gpus) {
      if (!index_of.count(u))
        known = false;
      else
        a.containers[0].gpus.push_back(index_of[u]);
    }
    if (known) {
      a.containers[0].milli = cr.whole_gpus ? placement::kMilliPerGpu : cr.milli;
      a.containers[0].memory_bytes =
          cr.whole_gpus ? node.gpus[a.containers[0].gpus[0]].memory_total_bytes : cr.memory_bytes;
      placement::Node trial = node;
      if (placement::Apply(trial, pr, a).ok()) gpus = c.annotated_gpus;
    }
    if (gpus.empty()) {
      spdlog::warn("pod {}/{}: the extender's GPUs {} are not free here; placing on the node", c.ns,
                   c.pod, absl::StrJoin(c.annotated_gpus, ","));
    }
  }
  std::string reason = "the kubelet named no device IDs";
  if (gpus.empty() && !ids.empty()) {
    // Follow the kubelet's booking: GetPreferredAllocation put a container's units on the GPU(s) it
    // will get, and PodResources-based attribution (metrics, Correct()) reads the GPU from these
    // IDs, so the container must run where they lie. Without an extender choice there is nothing
    // else to go by: a booking that cannot be honoured is refused, not moved to another GPU.
    gpus = BookedGpus(ids, index_of, node, pr, options_.names.core, &reason);
  }
  if (gpus.empty()) {
    // Nowhere to run it within its share: refused (the kubelet fails the pod's admission), never
    // granted without a GPU.
    std::string extender;
    if (!c.annotated_gpus.empty()) {
      extender =
          absl::StrCat("the extender's GPUs ", absl::StrJoin(c.annotated_gpus, ","), " are full, ");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "vGPU Allocate: ", Who(c.ns, c.pod, c.container), " asks ", options_.names.core, " ", cores,
        ", but ", extender, "the kubelet's device IDs cannot be honoured: ", reason));
  }
  Grant g;
  g.pod_uid = c.uid;
  g.ns = c.ns;
  g.pod = c.pod;
  g.container = c.container;
  g.container_index = c.index;
  g.gpus = gpus;
  g.cores = cores;
  g.memory_units = memory_units;
  g.ceiling = c.ceiling;
  g.device_ids = std::move(ids);
  g.inject = c.inject;
  g.time_ns = clock_->UnixSeconds() * kNanosPerSecond;
  if (cores < kCoresPerGpu) {
    std::string pod_dir = absl::StrCat(options_.state_dir, "/", c.uid);
    RETURN_IF_ERROR(MakeDirs(pod_dir, 0700));  // sets 0700 on an existing one too
    g.accounting_dir = absl::StrCat(pod_dir, "/", c.container);
    auto [uid, gid] = RunAs(c.pod_json, c.index);
    RETURN_IF_ERROR(PrepareGrantDir(g.accounting_dir, LimitsOf(g),
                                    {uid, gid, options_.accounting_tmpfs,
                                     options_.library_host_path, PreloadPath()})
                        .status());
  }
  WritePodFile(g);
  grants_.push_back(g);
  if (absl::Status s = SaveLocked(); !s.ok()) {
    grants_.pop_back();
    return s;
  }
  // Which pod the guess picked and what the kubelet booked: what an operator (and a correction
  // that went wrong) needs to follow a grant.
  spdlog::info("vGPU: granted {} {} {} and {} {} on {} (devices {})", Who(g.ns, g.pod, g.container),
               options_.names.core, cores, options_.names.memory, memory_units,
               absl::StrJoin(g.gpus, ","), IdSummary(g.device_ids));
  spdlog::debug("vGPU: that grant's first device IDs: {} {}",
                g.device_ids.empty() ? "-" : g.device_ids.front(),
                static_cast<size_t>(cores) < g.device_ids.size() ? g.device_ids[cores] : "-");
  PatchAnnotations(g, c.pod_json);  // listed just now: the containers are all it reads
  if (options_.granted) options_.granted();
  return g;
}

void NodeAssigner::WritePodFile(const Grant& g) const {
  if (g.accounting_dir.empty() || g.pod.empty()) return;
  // Beside the grant's directory, which a correction may have given to another pod than the one
  // whose UID names the folder.
  std::string file = std::filesystem::path(g.accounting_dir).parent_path().string() + "/pod";
  if (absl::Status s = WriteFileAtomic(file, absl::StrCat(g.ns, "/", g.pod, "\n"), 0644); !s.ok())
    spdlog::warn("vGPU: {}", std::string(s.message()));  // metrics then name the pod by its UID
}

void NodeAssigner::PatchAnnotations(const Grant& g, const json& pod) {
  if (!api_) return;
  // Record where the container really is, and mark the pod assigned once every vGPU container is.
  json ann = {{kAnnotationNode, options_.node_name},
              {absl::StrCat(kAnnotationGpusPrefix, g.container_index), absl::StrJoin(g.gpus, ",")}};
  if (pod.is_object()) {
    auto req = ParsePod(pod, options_.names, 0);
    bool all =
        req.ok() &&
        std::all_of(req->containers.begin(), req->containers.end(), [&](const ContainerUnits& c) {
          // Runs here, on the thread that holds mu_; the analysis does not see into lambdas.
          mu_.AssertHeld();
          return std::any_of(grants_.begin(), grants_.end(), [&](const Grant& x) {
            return x.pod_uid == g.pod_uid && x.container_index == c.index;
          });
        });
    if (all) ann[kAnnotationAssigned] = "true";
  }
  auto r =
      api_->PatchPod(g.ns, g.pod, k8s::PatchType::kMerge, {{"metadata", {{"annotations", ann}}}});
  if (!r.ok()) spdlog::warn("annotate {}/{}: {}", g.ns, g.pod, std::string(r.status().message()));
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> NodeAssigner::Allocate(
    bool is_core, const std::vector<std::string>& ids) {
  absl::MutexLock l(&mu_);
  auto now = clock_->Now();
  if (pending_ && now - pending_->at > std::chrono::seconds(30)) pending_.reset();
  // The second call of a container's pair: both numbers are known now.
  if (pending_ && pending_->is_core != is_core) {
    std::vector<std::string> core_ids = is_core ? ids : pending_->ids;
    std::vector<std::string> mem_ids = is_core ? pending_->ids : ids;
    pending_.reset();
    std::vector<std::string> all = core_ids;
    all.insert(all.end(), mem_ids.begin(), mem_ids.end());
    ASSIGN_OR_RETURN(Grant g, GrantLocked(static_cast<int64_t>(core_ids.size()),
                                          static_cast<int64_t>(mem_ids.size()), all));
    return Response(g);
  }
  if (!is_core) return WaitForPairLocked(false, ids, now);
  // Cores first: a container without memory completes now; one with memory waits for its pair.
  if (!api_) {  // without pods to look at, the rules decide: a share always has memory
    if (ids.size() < static_cast<size_t>(kCoresPerGpu)) return WaitForPairLocked(true, ids, now);
    ASSIGN_OR_RETURN(Grant g, GrantLocked(static_cast<int64_t>(ids.size()), 0, ids));
    return Response(g);
  }
  ASSIGN_OR_RETURN(std::vector<Candidate> cands, CandidatesLocked());
  auto it = std::find_if(cands.begin(), cands.end(), [&](const Candidate& c) {
    return c.cores == static_cast<int64_t>(ids.size());
  });
  if (it != cands.end() && it->memory_units == 0) {
    ASSIGN_OR_RETURN(Grant g, GrantLocked(static_cast<int64_t>(ids.size()), 0, ids));
    return Response(g);
  }
  if (it == cands.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("vGPU Allocate: no Pending pod bound to node ", options_.node_name,
                     " has an unserved container asking ", options_.names.core, " ", ids.size()));
  }
  return WaitForPairLocked(true, ids, now);
}

v1beta1::ContainerAllocateResponse NodeAssigner::WaitForPairLocked(
    bool is_core, const std::vector<std::string>& ids, Clock::TimePoint now) {
  spdlog::debug("vGPU: Allocate {} ({}, first {}): waiting for the container's {}",
                is_core ? options_.names.core : options_.names.memory, IdSummary(ids),
                ids.empty() ? "-" : ids.front(),
                is_core ? options_.names.memory : options_.names.core);
  pending_ = Pending{is_core, ids, now};
  return v1beta1::ContainerAllocateResponse();  // empty: the pair's second call answers for both
}

v1beta1::ContainerAllocateResponse NodeAssigner::Response(const Grant& g) const {
  v1beta1::ContainerAllocateResponse r;
  if (options_.deliver) options_.deliver(g.gpus, &r);
  auto& env = *r.mutable_envs();
  // The GPU by UUID whatever the delivery put here, for a runtime that reads it (the shim).
  const std::string uuids = absl::StrJoin(g.gpus, ",");
  env["NVIDIA_VISIBLE_DEVICES"] = uuids;
  // Only when the pod is known: a grant made without an API server learns it later from
  // PodResources, and "//c" would name nothing.
  if (!g.pod.empty())
    (*r.mutable_annotations())["gpulet.io/vgpu-container"] =
        absl::StrCat(g.ns, "/", g.pod, "/", g.container);
  if (g.cores >= kCoresPerGpu) return r;  // whole GPUs: exclusive, nothing to enforce
  // The interposer's own name for its GPU is in the contract: a CDI spec sets
  // NVIDIA_VISIBLE_DEVICES to "void" in the container, so the UUID above does not reach it where
  // GPUs come through CDI.
  ContainerContract contract = BuildContract(
      LimitsOf(g), GrantDirFiles(g.accounting_dir, options_.library_host_path, PreloadPath()));
  for (const auto& [name, value] : contract.env) env[name] = value;
  for (const auto& m : contract.mounts) {
    auto* mount = r.add_mounts();
    mount->set_host_path(m.host_path);
    mount->set_container_path(m.container_path);
    mount->set_read_only(m.read_only);
  }
  return r;
}

ContainerLimits NodeAssigner::LimitsOf(const Grant& g) {
  ContainerLimits l;
  l.uuid = absl::StrJoin(g.gpus, ",");
  l.memory_bytes = MemoryUnitsToBytes(g.memory_units);
  l.cores = g.cores;
  l.ceiling = std::max(g.ceiling, g.cores);
  l.inject = g.inject;
  return l;
}

std::string NodeAssigner::PreloadPath() const { return options_.state_dir + "/ld.so.preload"; }

std::string NodeAssigner::PredictGpu(int64_t cores, int64_t memory_units) {
  absl::MutexLock l(&mu_);
  // The kubelet asks for a container's resources one after the other (preference, then Allocate,
  // per resource): when the other half of the pair is pending, its GPU is where this half goes.
  if (pending_ && !pending_->ids.empty() && pending_->is_core == (memory_units > 0)) {
    auto by_gpu = CountByGpu(pending_->ids);
    if (by_gpu.size() == 1) return by_gpu.begin()->first;
  }
  auto cands = CandidatesLocked();
  if (!cands.ok()) return "";
  for (const auto& c : *cands) {
    if ((cores == 0 || c.cores == cores) && (memory_units == 0 || c.memory_units == memory_units)) {
      return c.annotated_gpus.empty() ? "" : c.annotated_gpus[0];
    }
  }
  return "";
}

absl::Status NodeAssigner::Release(const std::set<std::string>& live_uids) {
  absl::MutexLock l(&mu_);
  std::set<std::string> gone;
  for (const auto& g : grants_)
    if (!live_uids.count(g.pod_uid)) gone.insert(g.pod_uid);
  return ReleaseLocked(gone);
}

absl::Status NodeAssigner::ReleaseNotHeld(const std::set<std::string>& held,
                                          std::chrono::nanoseconds grace) {
  return ReleaseOlder(grace, [&held](const Grant& g) {
    return std::none_of(g.device_ids.begin(), g.device_ids.end(),
                        [&](const std::string& id) { return held.count(id) > 0; });
  });
}

absl::Status NodeAssigner::ReleaseOlder(std::chrono::nanoseconds grace,
                                        const std::function<bool(const Grant&)>& gone) {
  int64_t now = clock_->UnixSeconds() * kNanosPerSecond;
  absl::MutexLock l(&mu_);
  std::set<std::string> uids;
  for (const auto& g : grants_) {
    if (gone(g) && now - g.time_ns > grace.count()) uids.insert(g.pod_uid);
  }
  return ReleaseLocked(uids);
}

absl::Status NodeAssigner::ReleaseLocked(const std::set<std::string>& gone) {
  if (gone.empty()) return absl::OkStatus();
  std::set<std::string> pod_dirs;  // the released pods' folders, and their grants' folders' ones
  for (const auto& uid : gone)
    if (!uid.empty()) pod_dirs.insert(options_.state_dir + "/" + uid);
  for (const auto& g : grants_) {
    if (!gone.count(g.pod_uid)) continue;
    if (absl::Status s = RemoveGrantDir(g.accounting_dir); !s.ok())
      spdlog::warn("vGPU: {}", std::string(s.message()));
    if (!g.accounting_dir.empty())
      pod_dirs.insert(std::filesystem::path(g.accounting_dir).parent_path().string());
  }
  std::erase_if(grants_, [&](const Grant& g) { return gone.count(g.pod_uid) > 0; });
  for (const auto& dir : pod_dirs) {
    // A corrected grant lives in the folder named for the pod it was first made for: that folder
    // stays while such a grant does.
    bool used = std::any_of(grants_.begin(), grants_.end(), [&](const Grant& g) {
      return absl::StartsWith(g.accounting_dir, dir + "/");
    });
    std::error_code ec;
    if (!used) std::filesystem::remove_all(dir, ec);
  }
  for (const auto& uid : gone) spdlog::info("vGPU: released the GPUs of pod {}", uid);
  return SaveLocked();
}

absl::Status NodeAssigner::PublishPool(const std::function<bool(const std::string&)>& healthy) {
  if (!api_) return absl::FailedPreconditionError("no API client");
  std::vector<PoolGpu> now = pool_;
  for (auto& g : now) g.healthy = g.healthy && (!healthy || healthy(g.uuid));
  std::string text = EncodeNodePool(now);
  {
    absl::MutexLock l(&mu_);
    if (text == published_) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(
      json ignored,
      api_->PatchNode(options_.node_name, k8s::PatchType::kMerge,
                      {{"metadata", {{"annotations", {{kAnnotationNodeGpus, text}}}}}}));
  absl::MutexLock l(&mu_);
  published_ = text;
  return absl::OkStatus();
}

absl::Status NodeAssigner::ReleaseGoneFromApi() {
  if (!api_) return absl::FailedPreconditionError("no API client");
  {
    absl::ReleasableMutexLock l(&pods_mu_);
    if (pods_synced_) {
      std::set<std::string> live = live_pods_;
      l.Release();
      return ReleaseAbsent(live);
    }
  }
  ASSIGN_OR_RETURN(json pods,
                   api_->ListPods("", {.field_selector = "spec.nodeName=" + options_.node_name}));
  std::set<std::string> live;
  for (const auto& p : pods["items"]) {
    if (!PodEnded(p)) live.insert(PodUid(p));
  }
  return Release(live);  // listed after every grant made so far: no grace needed
}

absl::Status NodeAssigner::ReleaseAbsent(const std::set<std::string>& live) {
  // A grant made from a LIST at Allocate can precede its pod's watch event by the watch's lag.
  return ReleaseOlder(std::chrono::seconds(10),
                      [&live](const Grant& g) { return !live.count(g.pod_uid); });
}

NodeAssigner::~NodeAssigner() { StopWatching(); }

void NodeAssigner::StartWatching() {
  if (!api_ || reflector_) return;
  reflector_ = std::make_unique<k8s::Reflector>(
      api_, "/api/v1/pods",
      k8s::ListOptions{.field_selector = "spec.nodeName=" + options_.node_name},
      [this](const std::vector<json>& items) {
        std::set<std::string> live;
        for (const json& p : items) {
          if (!PodEnded(p)) live.insert(PodUid(p));
        }
        {
          absl::MutexLock l(&pods_mu_);
          live_pods_ = live;
          pods_synced_ = true;
        }
        if (absl::Status s = ReleaseAbsent(live); !s.ok())
          spdlog::warn("vGPU: {}", std::string(s.message()));
      },
      [this](const k8s::WatchEvent& ev) {
        std::string uid = PodUid(ev.object);
        if (uid.empty()) return;
        bool gone = ev.type == "DELETED" || PodEnded(ev.object);
        {
          absl::MutexLock l(&pods_mu_);
          if (gone) {
            live_pods_.erase(uid);
          } else {
            live_pods_.insert(uid);
          }
        }
        if (!gone) return;
        absl::MutexLock l(&mu_);
        bool held = std::any_of(grants_.begin(), grants_.end(),
                                [&](const Grant& g) { return g.pod_uid == uid; });
        if (!held) return;
        if (absl::Status s = ReleaseLocked({uid}); !s.ok())
          spdlog::warn("vGPU: {}", std::string(s.message()));
      });
  reflector_->Start();
}

void NodeAssigner::StopWatching() {
  if (reflector_) reflector_->Stop();
  reflector_.reset();
}

bool NodeAssigner::watch_synced() const {
  absl::MutexLock l(&pods_mu_);
  return pods_synced_;
}

absl::Status NodeAssigner::Correct(
    const std::map<std::string, std::pair<std::string, std::string>>& owner_of) {
  absl::MutexLock l(&mu_);
  // One pass can leave work for another: like pods in a chain (a grant moved away leaves its pod
  // waiting, and another grant, recorded for a third pod, holds that pod's devices). Each pass
  // writes its annotations before the next lists the waiting pods; a pass that changes nothing
  // ends it.
  for (int pass = 0; pass < 8; ++pass) {
    ASSIGN_OR_RETURN(bool changed, CorrectPassLocked(owner_of));
    if (!changed) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> NodeAssigner::CorrectPassLocked(
    const std::map<std::string, std::pair<std::string, std::string>>& owner_of) {
  std::set<size_t> touched;
  // The pods a grant was taken from: each gets the GPUs the extender had set aside for the pod the
  // grant went to (a hand-over of the two reservations, so that the waiting pod's own Allocate
  // finds room where the extender counted it).
  struct Handed {
    std::string ns, pod;
    int index = 0;
    std::vector<std::string> gpus;
  };
  std::vector<Handed> moved_from;
  std::optional<std::vector<Candidate>> waiting;  // listed once, when needed
  for (size_t i = 0; i < grants_.size(); ++i) {
    Grant& g = grants_[i];
    if (g.device_ids.empty()) continue;
    auto o = owner_of.find(g.device_ids[0]);
    if (o == owner_of.end()) continue;
    // Plain names, not a structured binding: lambdas below use them (C++17).
    const std::string& pod_key = o->second.first;     // "ns/name"
    const std::string& container = o->second.second;  // container name
    if (pod_key == g.ns + "/" + g.pod && container == g.container) continue;
    // The kubelet gave these devices to another container: find its grant and swap identities
    // (the GPUs stay with the devices, which is where the containers really run).
    bool swapped = false;
    for (size_t j = 0; j < grants_.size() && !swapped; ++j) {
      Grant& h = grants_[j];
      if (j == i || h.ns + "/" + h.pod != pod_key || h.container != container) continue;
      spdlog::warn("vGPU: kubelet admitted {}/{} and {} in the other order; records swapped", g.ns,
                   g.pod, pod_key);
      std::swap(g.pod_uid, h.pod_uid);
      std::swap(g.ns, h.ns);
      std::swap(g.pod, h.pod);
      std::swap(g.container, h.container);
      std::swap(g.container_index, h.container_index);
      std::swap(g.ceiling, h.ceiling);
      touched.insert({i, j});
      swapped = true;
    }
    if (swapped) continue;
    if (g.pod_uid.rfind("unknown-", 0) == 0) {
      // A grant made without an API server learns its pod from the kubelet's record.
      size_t slash = pod_key.find('/');
      g.ns = pod_key.substr(0, slash);
      g.pod = slash == std::string::npos ? pod_key : pod_key.substr(slash + 1);
      g.container = container;
      touched.insert(i);
      continue;
    }
    // The kubelet's container has no grant yet: it was admitted before the pod this grant was
    // made for, and holds the grant's devices and GPU. The grant is its; the other pod is waiting
    // again, with the reservation handed over below, and gets its own grant at its Allocate.
    if (!api_) continue;
    if (!waiting) {
      // Running pods too: by the time a correction looks (a restarted agent's first pass), the
      // kubelet may have started the container that holds these devices.
      auto listed = CandidatesLocked(/*started_too=*/true);
      if (!listed.ok())  // the next pass tries again; what is corrected so far is kept below
        spdlog::warn("vGPU: correcting {}/{}: {}", g.ns, g.pod,
                     std::string(listed.status().message()));
      waiting = listed.ok() ? *std::move(listed) : std::vector<Candidate>{};
    }
    auto c = std::find_if(waiting->begin(), waiting->end(), [&](const Candidate& c) {
      return c.ns + "/" + c.pod == pod_key && c.container == container && c.cores == g.cores &&
             c.memory_units == g.memory_units;
    });
    if (c == waiting->end()) continue;
    spdlog::warn("vGPU: kubelet admitted {} before {}/{}; the grant moves to it", pod_key, g.ns,
                 g.pod);
    moved_from.push_back({g.ns, g.pod, g.container_index, c->annotated_gpus});
    g.pod_uid = c->uid;
    g.ns = c->ns;
    g.pod = c->pod;
    g.container = c->container;
    g.container_index = c->index;
    g.ceiling = c->ceiling;
    waiting->erase(c);
    touched.insert(i);
  }
  if (touched.empty()) return false;
  std::map<size_t, json>
      pods;  // each touched grant's pod, read once for its folder and annotations
  for (size_t i : touched) {
    const Grant& g = grants_[i];
    if (api_ && !g.pod.empty())
      if (auto got = api_->GetPod(g.ns, g.pod); got.ok()) pods[i] = *std::move(got);
    RefitGrantDirLocked(g, pods[i]);
  }
  RETURN_IF_ERROR(SaveLocked());
  for (size_t i : touched) WritePodFile(grants_[i]);
  for (size_t i : touched) PatchAnnotations(grants_[i], pods[i]);
  for (const Handed& from : moved_from) {
    bool holds = std::any_of(grants_.begin(), grants_.end(),
                             [&](const Grant& g) { return g.ns == from.ns && g.pod == from.pod; });
    json ann = {{absl::StrCat(kAnnotationGpusPrefix, from.index),
                 from.gpus.empty() ? json(nullptr) : json(absl::StrJoin(from.gpus, ","))}};
    if (!holds) ann[kAnnotationAssigned] = "false";
    auto r = api_->PatchPod(from.ns, from.pod, k8s::PatchType::kMerge,
                            {{"metadata", {{"annotations", ann}}}});
    if (!r.ok())
      spdlog::warn("annotate {}/{}: {}", from.ns, from.pod, std::string(r.status().message()));
  }
  return true;
}

absl::Status NodeAssigner::Reannotate() {
  if (!api_) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      json pods,
      api_->ListPods("", {.field_selector = absl::StrCat("spec.nodeName=", options_.node_name)}));
  absl::MutexLock l(&mu_);
  for (const json& pod : pods["items"]) {
    for (const Grant& g : grants_) {
      if (g.pod_uid != PodUid(pod)) continue;
      if (Ann(pod, kAnnotationNode) == options_.node_name &&
          Ann(pod, absl::StrCat(kAnnotationGpusPrefix, g.container_index)) ==
              absl::StrJoin(g.gpus, ","))
        continue;
      spdlog::warn("vGPU: pod {}/{}: its annotations do not name its grant's GPUs; rewritten", g.ns,
                   g.pod);
      PatchAnnotations(g, pod);
    }
  }
  return absl::OkStatus();
}

void NodeAssigner::RefitGrantDirLocked(const Grant& g, const json& pod) {
  if (g.accounting_dir.empty()) return;
  auto [uid, gid] = RunAs(pod, g.container_index);
  auto f = PrepareGrantDir(
      g.accounting_dir, LimitsOf(g),
      {uid, gid, options_.accounting_tmpfs, options_.library_host_path, PreloadPath()});
  if (!f.ok()) spdlog::warn("vGPU: {}", std::string(f.status().message()));
}

}  // namespace gpulet::vgpu
