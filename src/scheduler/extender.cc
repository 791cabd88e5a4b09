#include "scheduler/extender.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "http/guarded_server.h"
#include "httplib.h"
#include "placement/vgpu_policy.h"
#include "spdlog/spdlog.h"

namespace gpulet::scheduler {
namespace {

std::string Str(const json& j, const char* a, const char* b = nullptr) {
  auto it = j.find(a);
  if (it == j.end()) return "";
  if (b) {
    if (!it->is_object()) return "";
    auto jt = it->find(b);
    return jt != it->end() && jt->is_string() ? jt->get<std::string>() : "";
  }
  return it->is_string() ? it->get<std::string>() : "";
}

std::string Annotation(const json& obj, const std::string& key) {
  auto md = obj.find("metadata");
  if (md == obj.end() || !md->contains("annotations")) return "";
  const json& a = (*md)["annotations"];
  auto it = a.find(key);
  return it != a.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& EmptyObject() {
  static const json kEmpty = json::object();
  return kEmpty;
}

// At most 2^52 milli-units in any one figure: 4.5 PB of memory, so sums of many stay in range.
constexpr int64_t kMilliCap = int64_t{1} << 52;

// The quantity `name` of a resource list in milli-units; 0 when absent or malformed.
int64_t MilliIn(const json& list, const char* name) {
  if (!list.is_object()) return 0;
  auto it = list.find(name);
  if (it == list.end()) return 0;
  if (it->is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), kMilliCap / 1000)) * 1000;
  }
  if (it->is_number_integer())
    return std::clamp<int64_t>(it->get<int64_t>(), 0, kMilliCap / 1000) * 1000;
  if (!it->is_string()) return 0;
  auto v = vgpu::ParseMilliQuantity(it->get<std::string>());
  return v.ok() && *v > 0 ? std::min(*v, kMilliCap) : 0;
}

// Sums of requests saturate at kMilliCap (what a pod's spec says is not trusted to be sane).
int64_t Plus(int64_t a, int64_t b) { return std::min(a + b, kMilliCap); }

// Milli-bytes to MiB, rounded up.
int64_t MiBOf(int64_t milli_bytes) {
  constexpr int64_t kMilliMiB = int64_t{1000} << 20;
  return milli_bytes / kMilliMiB + (milli_bytes % kMilliMiB != 0);
}

const json& Requests(const json& holder) {
  auto r = holder.find("resources");
  if (r == holder.end() || !r->is_object()) return EmptyObject();
  auto q = r->find("requests");
  return q != r->end() && q->is_object() ? *q : EmptyObject();
}

}  // namespace

std::pair<int64_t, int64_t> PodCpuMemory(const json& pod) {
  auto spec_it = pod.find("spec");
  if (spec_it == pod.end() || !spec_it->is_object()) return {0, 0};
  const json& spec = *spec_it;
  int64_t cpu = 0, mem = 0;  // milli-cores, milli-bytes
  const json& own = Requests(spec);
  if (own.contains("cpu") || own.contains("memory")) {  // pod-level resources
    cpu = MilliIn(own, "cpu");
    mem = MilliIn(own, "memory");
  } else {
    // kube-scheduler's rule (resource helpers' PodRequests): app containers and restartable
    // init containers (sidecars) run together; each other init container runs alone with the
    // sidecars started before it. The pod needs the larger of the two.
    int64_t sidecar_cpu = 0, sidecar_mem = 0, init_cpu = 0, init_mem = 0;
    if (auto inits = spec.find("initContainers"); inits != spec.end() && inits->is_array()) {
      for (const json& c : *inits) {
        if (!c.is_object()) continue;
        const json& r = Requests(c);
        if (Str(c, "restartPolicy") == "Always") {
          sidecar_cpu = Plus(sidecar_cpu, MilliIn(r, "cpu"));
          sidecar_mem = Plus(sidecar_mem, MilliIn(r, "memory"));
        } else {
          init_cpu = std::max(init_cpu, Plus(sidecar_cpu, MilliIn(r, "cpu")));
          init_mem = std::max(init_mem, Plus(sidecar_mem, MilliIn(r, "memory")));
        }
      }
    }
    if (auto cs = spec.find("containers"); cs != spec.end() && cs->is_array()) {
      for (const json& c : *cs) {
        if (!c.is_object()) continue;
        cpu = Plus(cpu, MilliIn(Requests(c), "cpu"));
        mem = Plus(mem, MilliIn(Requests(c), "memory"));
      }
    }
    cpu = std::max(Plus(cpu, sidecar_cpu), init_cpu);
    mem = std::max(Plus(mem, sidecar_mem), init_mem);
  }
  if (auto o = spec.find("overhead"); o != spec.end()) {
    cpu = Plus(cpu, MilliIn(*o, "cpu"));
    mem = Plus(mem, MilliIn(*o, "memory"));
  }
  return {cpu, MiBOf(mem)};
}

namespace {

// Appends `v` as a JSON string literal.
void AppendQuoted(std::string& out, std::string_view v) {
  out += '"';
  for (char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  out += '"';
}

// Candidate node names of ExtenderArgs: NodeNames (nodeCacheCapable) or Nodes.items. The
// pointers are into `args`.
std::vector<const std::string*> CandidateNames(const json& args, bool* with_items) {
  static const std::string kEmpty;
  std::vector<const std::string*> out;
  *with_items = false;
  auto nn = args.find("NodeNames");
  if (nn != args.end() && nn->is_array()) {
    out.reserve(nn->size());
    for (const auto& n : *nn) {
      if (n.is_string()) out.push_back(n.get_ptr<const std::string*>());
    }
    return out;
  }
  auto nodes = args.find("Nodes");
  if (nodes != args.end() && nodes->is_object()) {
    auto items = nodes->find("items");
    if (items == nodes->end() || !items->is_array()) return out;
    *with_items = true;
    for (const auto& n : *items) {
      const std::string* name = &kEmpty;
      if (auto md = n.find("metadata"); md != n.end() && md->is_object()) {
        if (auto nm = md->find("name"); nm != md->end() && nm->is_string()) {
          name = nm->get_ptr<const std::string*>();
        }
      }
      out.push_back(name);
    }
  }
  return out;
}

// ExtenderFilterResult: kept nodes (names, or the Node objects when the request carried them)
// and the failed ones with reasons.
std::string FilterResult(const json& args, const std::vector<const std::string*>& names,
                         const std::vector<std::pair<size_t, std::string>>& failed,
                         const std::vector<std::pair<size_t, std::string>>& unresolvable,
                         bool with_items) {
  std::vector<bool> keep(names.size(), true);
  for (const auto& [i, why] : failed) keep[i] = false;
  for (const auto& [i, why] : unresolvable) keep[i] = false;
  std::string out;
  out.reserve(names.size() * 16 + 128);
  out += with_items ? R"({"NodeNames":null,"Nodes":{"items":[)" : R"({"Nodes":null,"NodeNames":[)";
  bool first = true;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!keep[i]) continue;
    if (!first) out += ',';
    first = false;
    if (with_items) {
      out += args["Nodes"]["items"][i].dump();
    } else {
      AppendQuoted(out, *names[i]);
    }
  }
  out += with_items ? "]}" : "]";
  for (const auto* part : {&failed, &unresolvable}) {
    out += part == &failed ? R"(,"FailedNodes":{)" : R"(,"FailedAndUnresolvableNodes":{)";
    for (size_t k = 0; k < part->size(); ++k) {
      if (k) out += ',';
      AppendQuoted(out, *names[(*part)[k].first]);
      out += ':';
      AppendQuoted(out, (*part)[k].second);
    }
    out += '}';
  }
  out += R"(,"Error":""})";
  return out;
}

bool IsLabelChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

}  // namespace

bool IsDns1123Label(std::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), IsLabelChar);
}

bool IsDns1123Subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view part : absl::StrSplit(absl::string_view(s.data(), s.size()), '.')) {
    if (!IsDns1123Label(std::string_view(part.data(), part.size()))) return false;
  }
  return true;
}

Extender::Extender(k8s::Client* api, ExtenderOptions options)
    : api_(api), options_(std::move(options)) {
  int threads = options_.score_threads;
  if (threads < 0)
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 0, 7);
  scorers_ = std::make_unique<ParallelFor>(threads);
  for (const std::string& n : vgpu::VgpuPolicyNames()) {
    if (auto p = vgpu::MakeVgpuPolicy(n); p.ok()) policies_[n] = std::move(*p);
  }
}

Extender::~Extender() { StopWatching(); }

absl::StatusOr<const placement::Policy*> Extender::PolicyFor(const json& pod) const {
  return PolicyNamed(Annotation(pod, vgpu::kAnnotationPolicy));
}

absl::StatusOr<const placement::Policy*> Extender::PolicyNamed(std::string name) const {
  if (name.empty()) name = options_.default_policy;
  auto it = policies_.find(name);
  if (it == policies_.end()) {
    std::vector<std::string> known;
    for (const auto& [k, v] : policies_) known.push_back(k);
    return absl::InvalidArgumentError(absl::StrCat("unknown placement policy \"", name, "\" (",
                                                   vgpu::kAnnotationPolicy,
                                                   "; known: ", absl::StrJoin(known, ", "), ")"));
  }
  return it->second.get();
}

absl::StatusOr<std::pair<placement::PodRequest, std::vector<int>>> Extender::RequestOf(
    const json& pod) const {
  ASSIGN_OR_RETURN(vgpu::PodUnits req, vgpu::ParsePod(pod, options_.names, 0));
  std::pair<placement::PodRequest, std::vector<int>> out;
  out.first.name =
      absl::StrCat(Str(pod, "metadata", "namespace"), "/", Str(pod, "metadata", "name"));
  std::tie(out.first.cpu_milli, out.first.memory_mib) = PodCpuMemory(pod);
  for (const auto& c : req.containers) {
    out.first.containers.push_back(vgpu::PlacementRequestOf(c));
    out.second.push_back(c.index);
  }
  return out;
}

void Extender::ApplyLocked(const std::string& uid, Booking b) {
  ReleaseLocked(uid);
  auto it = nodes_.find(b.node);
  bool applied = false;
  if (it != nodes_.end()) {
    absl::Status s = placement::Apply(it->second.node, b.request, b.assignment);
    if (!s.ok()) {
      spdlog::warn("pod {}/{} on {}: its recorded GPUs do not fit: {}", b.ns, b.name, b.node,
                   std::string(s.message()));
    }
    applied = s.ok();
    if (!applied) unfitted_[b.node].insert(uid);
  }
  b.applied = applied;
  bookings_[uid] = std::move(b);
  ++generation_;
}

void Extender::ReleaseLocked(const std::string& uid) {
  auto it = bookings_.find(uid);
  if (it == bookings_.end()) return;
  reserved_.erase(uid);
  Booking& b = it->second;
  bool freed = false;
  if (b.applied) {
    if (auto n = nodes_.find(b.node); n != nodes_.end()) {
      absl::Status s = placement::Release(n->second.node, b.request, b.assignment);
      if (!s.ok()) spdlog::warn("release {}/{}: {}", b.ns, b.name, std::string(s.message()));
      freed = s.ok();
    }
  } else if (auto u = unfitted_.find(b.node); u != unfitted_.end()) {
    u->second.erase(uid);
    if (u->second.empty()) unfitted_.erase(u);
  }
  std::string node = std::move(b.node);
  bookings_.erase(it);
  ++generation_;
  if (freed) RefitLocked(node);
}

void Extender::RefitLocked(const std::string& node) {
  // A pod's recorded GPUs can overlap another pod's for a moment: when the kubelet admits two
  // like pods in the other order, the agent swaps their GPUs and records them one pod at a time,
  // so the first record lands on GPUs the second pod still holds. Left uncounted, that pod's share
  // would look free and be bound again; it is counted as soon as its node has the room.
  auto u = unfitted_.find(node);
  auto n = nodes_.find(node);
  if (u == unfitted_.end() || n == nodes_.end()) return;
  std::vector<std::string> uids(u->second.begin(), u->second.end());
  for (const std::string& uid : uids) {
    auto b = bookings_.find(uid);
    if (b == bookings_.end() || b->second.node != node || b->second.applied) {
      u->second.erase(uid);
      continue;
    }
    if (placement::Apply(n->second.node, b->second.request, b->second.assignment).ok()) {
      spdlog::info("pod {}/{} on {}: its recorded GPUs fit now", b->second.ns, b->second.name,
                   node);
      b->second.applied = true;
      u->second.erase(uid);
      ++generation_;
    }
  }
  if (u->second.empty()) unfitted_.erase(u);
}

void Extender::Reserve(const json& pod, const std::string& node, placement::PodRequest request,
                       std::vector<int> containers, const placement::Policy& policy) {
  std::string uid = Str(pod, "metadata", "uid");
  if (!api_ || uid.empty()) return;  // nothing binds through this extender
  absl::MutexLock l(&mu_);
  ExpireLocked();
  ReleaseLocked(uid);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  auto score = policy.Score(it->second.node, request);
  if (!score) return;
  Booking b{node,
            Str(pod, "metadata", "namespace"),
            Str(pod, "metadata", "name"),
            std::move(request),
            score->assignment,
            std::move(containers),
            true,
            false};
  ApplyLocked(uid, std::move(b));
  reserved_[uid] = options_.clock->Now() + options_.reservation_ttl;
}

void Extender::ExpireLocked() {
  if (reserved_.empty()) return;
  Clock::TimePoint now = options_.clock->Now();
  std::vector<std::string> due;
  for (const auto& [uid, at] : reserved_) {
    if (at <= now) due.push_back(uid);
  }
  for (const auto& uid : due) {
    spdlog::info("reservation of pod uid {} expired without a bind", uid);
    ReleaseLocked(uid);
  }
}

void Extender::DropReservation(const std::string& uid) {
  {
    absl::ReaderMutexLock l(&mu_);
    if (reserved_.empty()) return;
  }
  absl::MutexLock l(&mu_);
  ExpireLocked();
  if (reserved_.contains(uid)) ReleaseLocked(uid);
}

size_t Extender::reserved_pods() const {
  absl::ReaderMutexLock l(&mu_);
  return reserved_.size();
}

void Extender::UpsertNode(const json& node) {
  try {
    UpsertNodeUnguarded(node);
  } catch (const std::exception& e) {  // the watch-callback boundary (see Guarded below)
    spdlog::error("node {}: skipped: {}", Str(node, "metadata", "name"), e.what());
  }
}

void Extender::UpsertPod(const json& pod) {
  try {
    UpsertPodUnguarded(pod);
  } catch (const std::exception& e) {
    spdlog::error("pod {}/{}: skipped: {}", Str(pod, "metadata", "namespace"),
                  Str(pod, "metadata", "name"), e.what());
  }
}

namespace {

// The pods that hold GPUs: not yet ended.
constexpr char kActivePods[] = "status.phase!=Succeeded,status.phase!=Failed";

// The node's status.allocatable (else its capacity; else an empty object).
const json& Allocatable(const json& node) {
  auto status = node.find("status");
  if (status != node.end() && status->is_object()) {
    for (const char* key : {"allocatable", "capacity"}) {
      if (auto a = status->find(key); a != status->end() && a->is_object()) return *a;
    }
  }
  return EmptyObject();
}

// Erases o's members not named in `keys` (o untouched when it is no object). In place: what is
// kept stays where the parser put it, so the list's memory is given back whole once it is freed.
void KeepOnly(json& o, std::initializer_list<std::string_view> keys) {
  if (!o.is_object()) return;
  for (auto it = o.begin(); it != o.end();) {
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
      it = o.erase(it);
    } else {
      ++it;
    }
  }
}

json* Find(json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it != o.end() ? &*it : nullptr;
}

// Keeps of metadata.annotations only gpulet's (the others, kubectl's last-applied configuration
// for one, can be large and are never read here).
void KeepGpuletAnnotations(json& o) {
  json* md = Find(o, "metadata");
  json* a = md ? Find(*md, "annotations") : nullptr;
  if (!a || !a->is_object()) return;
  for (auto it = a->begin(); it != a->end();) {
    if (absl::StartsWith(it.key(), "gpulet.io/")) {
      ++it;
    } else {
      it = a->erase(it);
    }
  }
}

}  // namespace

k8s::KeepFn Extender::ServesFn() const {
  return [this](json& node) {
    if (!options_.all_pods && Annotation(node, vgpu::kAnnotationNodeGpus).empty() &&
        vgpu::QuantityIn(Allocatable(node), options_.names.core) < vgpu::kCoresPerGpu)
      return false;
    // What UpsertNode reads: the name, the inventory, the vGPU capacity, CPU and memory.
    KeepOnly(node, {"metadata", "status"});
    KeepGpuletAnnotations(node);
    if (json* md = Find(node, "metadata")) KeepOnly(*md, {"name", "uid", "annotations"});
    if (json* status = Find(node, "status")) {
      KeepOnly(*status, {"allocatable", "capacity"});
      for (const char* key : {"allocatable", "capacity"})
        if (json* q = Find(*status, key))
          KeepOnly(*q, {options_.names.core, options_.names.memory, "cpu", "memory"});
    }
    return true;
  };
}

k8s::KeepFn Extender::PodsKeptFn(
    std::shared_ptr<const absl::flat_hash_set<std::string>> nodes) const {
  return [this, nodes = std::move(nodes)](json& pod) {
    auto facts = FactsOf(pod);
    if (!facts.ok()) return false;
    if (!Places(facts->request)) {
      // Another pod: kept (for its CPU and memory) only when bound to a node served.
      if (facts->node.empty()) return false;
      if (nodes) {
        if (!nodes->contains(facts->node)) return false;
      } else {
        absl::ReaderMutexLock l(&mu_);
        if (!nodes_.contains(facts->node)) return false;
      }
    }
    // What FactsOf, PodCpuMemory and UpsertPod read: identity, gpulet's annotations, deletion,
    // the node, the scheduler, the resources, the phase.
    KeepOnly(pod, {"metadata", "spec", "status"});
    KeepGpuletAnnotations(pod);
    if (json* md = Find(pod, "metadata"))
      KeepOnly(*md,
               {"name", "namespace", "uid", "deletionTimestamp", "resourceVersion", "annotations"});
    if (json* spec = Find(pod, "spec")) {
      KeepOnly(*spec, {"nodeName", "schedulerName", "initContainers", "containers", "overhead",
                       "resources"});
      for (const char* list : {"initContainers", "containers"})
        if (json* cs = Find(*spec, list); cs && cs->is_array())
          for (json& c : *cs) KeepOnly(c, {"name", "resources", "restartPolicy"});
    }
    if (json* status = Find(pod, "status")) KeepOnly(*status, {"phase"});
    return true;
  };
}

void Extender::UpsertNodeUnguarded(const json& node) {
  std::string name = Str(node, "metadata", "name");
  if (name.empty()) return;
  NodeState st;
  st.node.name = name;
  std::string inv = Annotation(node, vgpu::kAnnotationNodeGpus);
  if (!inv.empty()) {
    auto gpus = vgpu::DecodeNodePool(inv);
    if (!gpus.ok()) {
      // The agent writes this annotation; a malformed one (a bug, or someone with node patch
      // rights) must not take the scheduler down: the node offers no vGPU GPUs until fixed.
      spdlog::warn("node {}: annotation {} ignored, node left out of vGPU scheduling: {}", name,
                   vgpu::kAnnotationNodeGpus, std::string(gpus.status().message()));
      RemoveNode(name);
      return;
    }
    for (const vgpu::PoolGpu& g : *gpus) {
      placement::Gpu gpu;
      gpu.memory_total_bytes = vgpu::MemoryUnitsToBytes(g.memory_units);
      gpu.memory_free_bytes = gpu.memory_total_bytes;
      gpu.healthy = g.healthy;
      st.uuids.push_back(g.uuid.empty() ? absl::StrCat(name, "-gpu", st.uuids.size()) : g.uuid);
      st.node.gpus.push_back(gpu);
    }
  }
  if (st.node.gpus.empty()) {
    // No inventory annotation: the node's vGPU capacity, split evenly (GPU Manager's model).
    const json& alloc = Allocatable(node);
    int64_t gpus = std::clamp<int64_t>(
        vgpu::QuantityIn(alloc, options_.names.core) / vgpu::kCoresPerGpu, 0, kMaxNodeGpus);
    int64_t units = std::clamp<int64_t>(vgpu::QuantityIn(alloc, options_.names.memory), 0,
                                        kMaxNodeGpus * vgpu::kMaxMemoryUnitsPerGpu);
    for (int64_t i = 0; i < gpus; ++i) {
      placement::Gpu gpu;
      gpu.memory_total_bytes = vgpu::MemoryUnitsToBytes(units / gpus);
      gpu.memory_free_bytes = gpu.memory_total_bytes;
      st.uuids.push_back(absl::StrCat(name, "-gpu", i));
      st.node.gpus.push_back(gpu);
    }
  }
  for (size_t i = 0; i < st.uuids.size(); ++i) st.index_of[st.uuids[i]] = static_cast<int>(i);
  {
    const json& alloc = Allocatable(node);
    placement::Node& n = st.node;
    n.cpu_memory_binding = false;  // see extender.h
    n.cpu_milli_total = n.cpu_milli_free = MilliIn(alloc, "cpu");
    n.memory_mib_total = n.memory_mib_free = MiBOf(MilliIn(alloc, "memory"));
  }
  absl::ReleasableMutexLock l(&mu_);
  // Most node updates are the kubelet's status heartbeats: same GPUs, nothing to redo.
  if (auto cur = nodes_.find(name); cur != nodes_.end() && cur->second.uuids == st.uuids &&
                                    cur->second.node.cpu_milli_total == st.node.cpu_milli_total &&
                                    cur->second.node.memory_mib_total == st.node.memory_mib_total) {
    bool same = true;
    for (size_t g = 0; g < st.node.gpus.size() && same; ++g) {
      same = cur->second.node.gpus[g].memory_total_bytes == st.node.gpus[g].memory_total_bytes &&
             cur->second.node.gpus[g].healthy == st.node.gpus[g].healthy;
    }
    if (same) return;
  }
  // Re-apply what pods hold on this node onto the new capacity.
  std::vector<std::pair<std::string, Booking>> held;
  for (auto& [uid, b] : bookings_) {
    if (b.node == name) held.emplace_back(uid, b);
  }
  for (auto& [uid, b] : held) ReleaseLocked(uid);
  if (st.node.gpus.empty() && !options_.all_pods) {
    nodes_.erase(name);
  } else {
    nodes_[name] = std::move(st);
  }
  ++generation_;
  for (auto& [uid, b] : held) ApplyLocked(uid, std::move(b));
  std::vector<json> waiting;
  for (auto it = orphans_.begin(); it != orphans_.end();) {
    if (nodes_.count(name) && Str(it->second, "spec", "nodeName") == name) {
      waiting.push_back(std::move(it->second));
      it = orphans_.erase(it);
    } else {
      ++it;
    }
  }
  l.Release();
  for (const json& p : waiting) UpsertPod(p);
}

void Extender::RemoveNode(const std::string& name) {
  absl::MutexLock l(&mu_);
  nodes_.erase(name);
  ++generation_;
}

void Extender::UpsertPodUnguarded(const json& pod) {
  std::string uid = Str(pod, "metadata", "uid");
  if (uid.empty()) return;
  std::string phase = Str(pod, "status", "phase");
  std::string node = Str(pod, "spec", "nodeName");
  if (phase == "Succeeded" || phase == "Failed") return RemovePod(pod);
  auto facts = FactsOf(pod);
  if (!facts.ok()) return;
  const bool asks_vgpu = !facts->request.containers.empty();
  if (!Places(facts->request)) {
    // Another pod: counted for its CPU and memory once bound to a node served. Most of its events
    // (status updates of pods anywhere in the cluster) change nothing here: look under the
    // shared lock first.
    if (node.empty()) return;
    absl::ReaderMutexLock l(&mu_);
    if (!nodes_.contains(node)) return;
    if (auto old = bookings_.find(uid); old != bookings_.end() && old->second.node == node) return;
  } else {
    absl::MutexLock l(&mu_);
    auto [it, added] = shapes_.try_emplace(uid, facts->request);
    if (added) workload_dirty_ = true;
    if (node.empty()) {
      // Not bound: only a reservation or a bind in progress holds GPUs for it.
      pending_[uid] = std::move(*facts);
      return;
    }
    pending_.erase(uid);
  }
  Booking b;
  b.node = node;
  b.ns = std::move(facts->ns);
  b.name = std::move(facts->name);
  b.request = std::move(facts->request);
  b.container_index = std::move(facts->container_index);
  if (!asks_vgpu) {
    // Holds no GPU: its CPU and memory are booked on its node, when that node is served.
    absl::MutexLock l(&mu_);
    if (!nodes_.contains(node)) {
      if (options_.all_pods) orphans_[uid] = pod;  // its node is not known yet
      return;
    }
    orphans_.erase(uid);
    if (auto old = bookings_.find(uid);
        old != bookings_.end() && old->second.node == node && !reserved_.contains(uid)) {
      old->second.assumed = false;
      return;
    }
    ApplyLocked(uid, std::move(b));
    return;
  }
  std::string annotated = Annotation(pod, vgpu::kAnnotationNode);
  if (annotated != node) {  // bound without our assignment: the node places it
    absl::MutexLock l(&mu_);
    if (reserved_.contains(uid)) ReleaseLocked(uid);
    return;
  }
  absl::MutexLock l(&mu_);
  auto ns = nodes_.find(node);
  if (ns == nodes_.end()) {  // its node is not known yet: counted when the node arrives
    orphans_[uid] = pod;
    return;
  }
  for (size_t c = 0; c < b.request.containers.size(); ++c) {
    const auto& rc = b.request.containers[c];
    std::string list =
        Annotation(pod, absl::StrCat(vgpu::kAnnotationGpusPrefix, b.container_index[c]));
    placement::ContainerAssignment a;
    for (auto uuid : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      int idx = -1;
      if (ns != nodes_.end()) {
        auto it = ns->second.index_of.find(std::string(uuid));
        if (it != ns->second.index_of.end()) idx = it->second;
      }
      if (idx < 0) {
        // Its node's GPU list is not (yet) the one the pod names: the agent placed it before its
        // inventory annotation reached us (the node then came from its capacity, with made-up
        // GPU names). The booking it has stays counted somewhere on the node; the pod is taken
        // again when the node's GPUs change, so that it lands on the GPU it is really on.
        spdlog::warn("pod {}/{}: GPU {} is not a vGPU GPU of node {} (yet)", b.ns, b.name,
                     std::string(uuid), node);
        orphans_[uid] = pod;
        return;
      }
      a.gpus.push_back(idx);
    }
    if (rc.whole_gpus > 0) {
      a.milli = placement::kMilliPerGpu;
      a.memory_bytes = a.gpus.empty() ? 0 : ns->second.node.gpus[a.gpus[0]].memory_total_bytes;
    } else {
      a.milli = rc.milli;
      a.memory_bytes = rc.memory_bytes;
    }
    b.assignment.containers.push_back(std::move(a));
  }
  orphans_.erase(uid);
  if (auto old = bookings_.find(uid); old != bookings_.end()) {
    auto same = [](const placement::Assignment& x, const placement::Assignment& y) {
      if (x.containers.size() != y.containers.size()) return false;
      for (size_t i = 0; i < x.containers.size(); ++i) {
        if (x.containers[i].gpus != y.containers[i].gpus) return false;
      }
      return true;
    };
    if (old->second.node == node && same(old->second.assignment, b.assignment) &&
        !reserved_.contains(uid)) {
      old->second.assumed = false;
      return;
    }
  }
  ApplyLocked(uid, std::move(b));
}

void Extender::RemovePod(const json& pod) {
  std::string uid = Str(pod, "metadata", "uid");
  absl::MutexLock l(&mu_);
  orphans_.erase(uid);
  pending_.erase(uid);
  if (shapes_.erase(uid)) workload_dirty_ = true;
  ReleaseLocked(uid);
}

void Extender::RebuildWorkload() {
  absl::MutexLock l(&mu_);
  std::vector<placement::PodRequest> pods;
  pods.reserve(shapes_.size());
  for (const auto& [uid, r] : shapes_) pods.push_back(r);
  workload_ = placement::WorkloadFromPods(pods);
  // Policies are only read under the shared lock, so this exclusive section is their
  // "not thread-safe" SetWorkload window.
  for (auto& [name, p] : policies_) p->SetWorkload(workload_);
  workload_dirty_ = false;
  workload_built_ = true;
  workload_at_ = options_.clock->Now();
  ++generation_;
}

void Extender::MaybeRebuildWorkload() {
  {
    absl::ReaderMutexLock l(&mu_);
    if (!workload_dirty_) return;
    if (workload_built_ && options_.clock->Now() - workload_at_ < options_.workload_refresh) {
      return;
    }
  }
  RebuildWorkload();
}

placement::ClusterFree Extender::FreeLocked() const {
  placement::ClusterFree free;
  for (const auto& [name, e] : nodes_) free.Add(e.node);
  return free;
}

placement::Workload Extender::workload() const {
  absl::ReaderMutexLock l(&mu_);
  return workload_;
}

absl::Status Extender::Sync() {
  if (!api_) return absl::FailedPreconditionError("no API client");
  ASSIGN_OR_RETURN(k8s::Listed nodes, k8s::ListPaged(*api_, "/api/v1/nodes", {}, ServesFn()));
  auto names = std::make_shared<absl::flat_hash_set<std::string>>();
  for (const auto& n : nodes.items) names->insert(Str(n, "metadata", "name"));
  ASSIGN_OR_RETURN(k8s::Listed pods,
                   k8s::ListPaged(*api_, "/api/v1/pods", {.field_selector = kActivePods},
                                  PodsKeptFn(std::move(names))));
  {
    absl::MutexLock l(&mu_);
    nodes_.clear();
    unfitted_.clear();
    orphans_.clear();
    shapes_.clear();
    pending_.clear();
    workload_dirty_ = true;
    for (auto it = bookings_.begin(); it != bookings_.end();) {
      it = it->second.assumed ? std::next(it) : bookings_.erase(it);
    }
  }
  for (const auto& n : nodes.items) UpsertNode(n);
  for (const auto& p : pods.items) UpsertPod(p);
  nodes = {};
  pods = {};
  malloc_trim(0);  // as the Reflector does after its list
  return absl::OkStatus();
}

namespace {

// The watch-callback boundary: whatever an object from the API server holds, one bad object is
// logged and skipped, never an exception out of the reflector thread (std::terminate).
template <typename Fn>
auto Guarded(const char* what, Fn fn) {
  return [what, fn = std::move(fn)](const auto& arg) {
    try {
      fn(arg);
    } catch (const std::exception& e) {
      spdlog::error("{} watch: object skipped: {}", what, e.what());
    }
  };
}

}  // namespace

void Extender::StartWatching() {
  if (!api_ || node_reflector_) return;
  node_reflector_ =
      std::make_unique<k8s::Reflector>(api_, "/api/v1/nodes", k8s::ListOptions{},
                                       Guarded("node",
                                               [this](const std::vector<json>& items) {
                                                 std::vector<std::string> gone;
                                                 {
                                                   absl::ReaderMutexLock l(&mu_);
                                                   for (const auto& [name, st] : nodes_)
                                                     gone.push_back(name);
                                                 }
                                                 for (const auto& n : items) {
                                                   std::erase(gone, Str(n, "metadata", "name"));
                                                   UpsertNode(n);
                                                 }
                                                 for (const auto& g : gone) RemoveNode(g);
                                               }),
                                       Guarded("node",
                                               [this](const k8s::WatchEvent& ev) {
                                                 if (ev.type == "DELETED") {
                                                   RemoveNode(Str(ev.object, "metadata", "name"));
                                                 } else {
                                                   UpsertNode(ev.object);
                                                 }
                                               }),
                                       ServesFn());
  pod_reflector_ =
      std::make_unique<k8s::Reflector>(api_, "/api/v1/pods", k8s::ListOptions{},
                                       Guarded("pod",
                                               [this](const std::vector<json>& items) {
                                                 {
                                                   absl::MutexLock l(&mu_);
                                                   orphans_.clear();
                                                   shapes_.clear();
                                                   pending_.clear();
                                                   workload_dirty_ = true;
                                                   std::vector<std::string> drop;
                                                   for (const auto& [uid, b] : bookings_) {
                                                     if (!b.assumed) drop.push_back(uid);
                                                   }
                                                   for (const auto& uid : drop) ReleaseLocked(uid);
                                                 }
                                                 for (const auto& p : items) UpsertPod(p);
                                               }),
                                       Guarded("pod",
                                               [this](const k8s::WatchEvent& ev) {
                                                 if (ev.type == "DELETED") {
                                                   RemovePod(ev.object);
                                                 } else {
                                                   UpsertPod(ev.object);
                                                 }
                                               }),
                                       PodsKeptFn(nullptr));
  node_reflector_->Start();
  pod_reflector_->Start();
  node_reflector_->WaitSynced(std::chrono::seconds(10));
  pod_reflector_->WaitSynced(std::chrono::seconds(10));
}

void Extender::StopWatching() {
  if (pod_reflector_) pod_reflector_->Stop();
  if (node_reflector_) node_reflector_->Stop();
  pod_reflector_.reset();
  node_reflector_.reset();
}

json Extender::Filter(const json& args) { return json::parse(FilterWire(args)); }

std::string Extender::FilterWire(const json& args) {
  bool with_items = false;
  std::vector<const std::string*> names = CandidateNames(args, &with_items);
  if (with_items && !options_.echo_node_objects) {
    // Answering would mean re-serialising the request's Node objects (see ExtenderOptions).
    std::string out = R"({"Nodes":null,"NodeNames":null,"FailedNodes":{},"Error":)";
    AppendQuoted(out,
                 "gpulet extender: kube-scheduler sent whole Node objects; set nodeCacheCapable: "
                 "true in its extender configuration (or start gpulet scheduler with "
                 "--extender-echo-node-objects)");
    out += '}';
    return out;
  }
  std::vector<std::pair<size_t, std::string>> failed, unresolvable;
  auto pod_it = args.find("Pod");
  auto req = RequestOf(pod_it != args.end() ? *pod_it : EmptyObject());
  if (!req.ok()) {
    for (size_t i = 0; i < names.size(); ++i) {
      unresolvable.emplace_back(i, std::string(req.status().message()));
    }
  } else if (Places(req->first)) {
    const bool asks_vgpu = !req->first.containers.empty();
    // With a valid policy, score while checking feasibility (Score() is nullopt exactly when
    // the pod does not fit) and keep the scores for the prioritize that follows.
    auto policy = PolicyFor(pod_it != args.end() ? *pod_it : EmptyObject());
    const placement::Policy* pol = policy.ok() ? *policy : nullptr;
    std::string uid = pod_it != args.end() ? Str(*pod_it, "metadata", "uid") : "";
    DropReservation(uid);  // scheduled again: its last round's reservation is void
    if (pol) MaybeRebuildWorkload();
    ScoreCache fresh;
    {
      absl::ReaderMutexLock l(&mu_);
      fresh.generation = generation_.load();
      // Nodes are scored in parallel into per-candidate slots; the answer is assembled in
      // candidate order afterwards, so it is the same for any number of threads.
      struct Slot {
        const placement::Node* node = nullptr;
        std::optional<double> score;
        bool fits = false;
        std::string reason;
      };
      std::vector<Slot> slots(names.size());
      for (size_t i = 0; i < names.size(); ++i) {
        auto it = nodes_.find(*names[i]);
        // A node without GPUs (kept with all_pods) serves only pods that ask for none.
        if (it != nodes_.end() && (!asks_vgpu || !it->second.node.gpus.empty())) {
          slots[i].node = &it->second.node;
        }
      }
      const placement::ClusterFree free = pol ? FreeLocked() : placement::ClusterFree{};
      scorers_->Run(slots.size(), 64, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
          Slot& s = slots[i];
          if (s.node == nullptr) continue;
          s.fits = pol ? (s.score = pol->ScoreValue(*s.node, req->first, &free)).has_value()
                       : placement::Fits(*s.node, req->first);
          // Only the failures pay for the message.
          if (!s.fits) placement::Fits(*s.node, req->first, &s.reason);
        }
      });
      for (size_t i = 0; i < slots.size(); ++i) {
        const Slot& s = slots[i];
        if (s.node == nullptr) {
          // A pod without vGPU passes a node not known (yet): kube-scheduler checked its fit.
          if (asks_vgpu) unresolvable.emplace_back(i, "node has no gpulet vGPU GPUs");
        } else if (!s.fits) {
          failed.emplace_back(
              i, "vGPU: " + (s.reason.empty() ? "no placement on this node" : s.reason));
        } else if (s.score) {
          fresh.names.push_back(*names[i]);
          fresh.scores.push_back(*s.score);
        }
      }
    }
    // One node left: kube-scheduler binds there without calling prioritize.
    if (pol && fresh.names.size() == 1 && failed.size() + unresolvable.size() + 1 == names.size()) {
      Reserve(pod_it != args.end() ? *pod_it : EmptyObject(), fresh.names[0], req->first,
              req->second, *pol);
    } else if (pol && !uid.empty()) {
      fresh.pod_uid = std::move(uid);
      fresh.policy = pol;
      absl::MutexLock l(&cache_mu_);
      cache_ = std::move(fresh);
    }
  }
  return FilterResult(args, names, failed, unresolvable, with_items);
}

json Extender::Prioritize(const json& args) { return json::parse(PrioritizeWire(args)); }

std::string Extender::PrioritizeWire(const json& args) {
  bool with_items = false;
  std::vector<const std::string*> names = CandidateNames(args, &with_items);
  auto pod_it = args.find("Pod");
  const json& pod = pod_it != args.end() ? *pod_it : EmptyObject();
  std::vector<int64_t> final_scores(names.size(), 0);
  auto req = RequestOf(pod);
  auto policy = PolicyFor(pod);
  if (req.ok() && policy.ok() && Places(req->first)) {
    MaybeRebuildWorkload();
    std::vector<double> scores;
    std::vector<int> fit;  // positions in `names` that fit
    scores.reserve(names.size());
    fit.reserve(names.size());
    {
      // filter's scores when they are for this pod and policy and nothing changed since: the
      // candidates are then filter's survivors (or a subset), in order.
      absl::MutexLock l(&cache_mu_);
      std::string uid = Str(pod, "metadata", "uid");
      if (!uid.empty() && cache_.pod_uid == uid && cache_.policy == *policy &&
          cache_.generation == generation_.load()) {
        size_t j = 0;
        for (size_t i = 0; i < names.size(); ++i) {
          while (j < cache_.names.size() && cache_.names[j] != *names[i]) ++j;
          if (j == cache_.names.size()) break;
          scores.push_back(cache_.scores[j]);
          fit.push_back(static_cast<int>(i));
          ++j;
        }
        if (fit.size() != names.size()) {  // a candidate filter did not keep: score afresh
          scores.clear();
          fit.clear();
        }
      }
    }
    if (fit.empty()) {
      absl::ReaderMutexLock l(&mu_);
      std::vector<const placement::Node*> nodes(names.size(), nullptr);
      std::vector<std::optional<double>> slot(names.size());
      for (size_t i = 0; i < names.size(); ++i) {
        auto it = nodes_.find(*names[i]);
        if (it != nodes_.end()) nodes[i] = &it->second.node;
      }
      const placement::ClusterFree free = FreeLocked();
      scorers_->Run(names.size(), 64, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
          if (nodes[i] != nullptr) slot[i] = (*policy)->ScoreValue(*nodes[i], req->first, &free);
        }
      });
      for (size_t i = 0; i < names.size(); ++i) {
        if (slot[i]) {
          scores.push_back(*slot[i]);
          fit.push_back(static_cast<int>(i));
        }
      }
    }
    if (!fit.empty()) {
      // The best node (the first of equals, in kube-scheduler's order) alone gets the top score,
      // and this pod's GPUs are reserved there until its bind (see extender.h).
      size_t best = std::max_element(scores.begin(), scores.end()) - scores.begin();
      std::vector<int64_t> scaled = placement::ScaleScores(scores, 0, 10);
      for (size_t k = 0; k < fit.size(); ++k) {
        final_scores[fit[k]] = k == best ? 10 : std::min<int64_t>(scaled[k], 9);
      }
      Reserve(pod, *names[fit[best]], req->first, req->second, **policy);
    }
  }
  // HostPriorityList.
  std::string out;
  out.reserve(names.size() * 32 + 2);
  out += '[';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += R"({"Host":)";
    AppendQuoted(out, *names[i]);
    absl::StrAppend(&out, R"(,"Score":)", final_scores[i], "}");
  }
  out += ']';
  return out;
}

absl::StatusOr<Extender::PodFacts> Extender::FactsOf(const json& pod) const {
  PodFacts f;
  f.uid = Str(pod, "metadata", "uid");
  f.ns = Str(pod, "metadata", "namespace");
  f.name = Str(pod, "metadata", "name");
  f.node = Str(pod, "spec", "nodeName");
  f.phase = Str(pod, "status", "phase");
  auto md = pod.find("metadata");
  f.deleting = md != pod.end() && md->is_object() && md->contains("deletionTimestamp");
  f.scheduler = Str(pod, "spec", "schedulerName");
  if (f.scheduler.empty()) f.scheduler = "default-scheduler";
  f.policy = Annotation(pod, vgpu::kAnnotationPolicy);
  ASSIGN_OR_RETURN(auto req, RequestOf(pod));
  f.request = std::move(req.first);
  f.container_index = std::move(req.second);
  return f;
}

namespace {

// Whether a failed Binding write may still have been applied: anything but a definite refusal
// (400, 401, 403, 404, 422: nothing was written).
bool BindMayHaveHappened(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kNotFound:
      return false;
    default:
      return true;
  }
}

}  // namespace

json Extender::Bind(const json& args) {
  auto error = [](const std::string& e) { return json{{"Error", e}}; };
  auto field = [&args](const char* key) {
    auto it = args.find(key);
    return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  std::string name = field("PodName"), ns = field("PodNamespace");
  std::string uid = field("PodUID"), node = field("Node");
  if (name.empty() || ns.empty() || node.empty()) {
    return error("bind: PodName, PodNamespace and Node are required");
  }
  // Names go into API paths: only what Kubernetes itself would accept.
  if (!IsDns1123Label(ns)) {
    return error("bind: PodNamespace is not a DNS-1123 label (lower-case alphanumerics and '-')");
  }
  if (!IsDns1123Subdomain(name)) return error("bind: PodName is not a DNS-1123 subdomain");
  if (!IsDns1123Subdomain(node)) return error("bind: Node is not a DNS-1123 subdomain");
  if (!api_) return error("bind: no API server client");
  // The pod as the watch last showed it; a pod the watch has not delivered yet is read from the
  // API server (one GET). A stale cache cannot bind wrongly: the Binding carries the uid and the
  // API server refuses a pod already bound.
  std::optional<PodFacts> cached;
  if (!uid.empty()) {
    absl::ReaderMutexLock l(&mu_);
    if (auto it = pending_.find(uid);
        it != pending_.end() && it->second.ns == ns && it->second.name == name) {
      cached = it->second;
    }
  }
  if (!cached) {
    auto pod = api_->GetPod(ns, name);
    if (!pod.ok()) return error(std::string(pod.status().message()));
    auto facts = FactsOf(*pod);
    if (!facts.ok()) return error(std::string(facts.status().message()));
    cached = std::move(*facts);
  }
  const PodFacts& pod = *cached;
  const std::string who = absl::StrCat("bind: pod ", ns, "/", name);
  if (!uid.empty() && uid != pod.uid) {
    return error(absl::StrCat(who, " is not the pod asked for (uid ", pod.uid, ", not ", uid, ")"));
  }
  uid = pod.uid;
  // Only what kube-scheduler would legitimately ask: a pending, unbound vGPU pod of a scheduler
  // profile that calls this extender.
  if (!pod.node.empty()) return error(absl::StrCat(who, " is already bound to ", pod.node));
  if (pod.phase != "Pending") {
    return error(absl::StrCat(who, " is not Pending (phase \"", pod.phase, "\")"));
  }
  if (pod.deleting) return error(absl::StrCat(who, " is being deleted"));
  if (std::find(options_.scheduler_names.begin(), options_.scheduler_names.end(), pod.scheduler) ==
      options_.scheduler_names.end()) {
    return error(absl::StrCat(who, " belongs to scheduler \"", pod.scheduler,
                              "\", not one this extender serves (",
                              absl::StrJoin(options_.scheduler_names, ", "), ")"));
  }
  const bool asks_vgpu = !pod.request.containers.empty();
  if (!Places(pod.request)) {
    return error(
        absl::StrCat(who, " asks for no vGPU resources; this extender binds only vGPU pods"));
  }
  auto policy = PolicyNamed(pod.policy);
  if (!policy.ok()) return error(std::string(policy.status().message()));

  MaybeRebuildWorkload();
  json annotations = json::object();
  {
    absl::MutexLock l(&mu_);
    auto ns_it = nodes_.find(node);
    if (ns_it == nodes_.end() && asks_vgpu) {
      return error("bind: node " + node + " has no gpulet vGPU GPUs");
    }
    ExpireLocked();
    ReleaseLocked(uid);  // its reservation from prioritize, or a retried bind: re-chosen here
    // A pod without vGPU on a node not known (yet) is bound uncounted; the watch books it once
    // the node is known.
    auto score = ns_it == nodes_.end() ? std::optional<placement::NodeScore>(placement::NodeScore{})
                                       : (*policy)->Score(ns_it->second.node, pod.request);
    if (!score) {
      std::string reason;
      placement::Fits(ns_it->second.node, pod.request, &reason);
      // kube-scheduler retries the pod after its backoff; the log says why it waited.
      spdlog::warn("bind refused: pod {}/{} no longer fits on {}: {}", ns, name, node, reason);
      return error(
          absl::StrCat("bind: pod ", ns, "/", name, " no longer fits on ", node, ": ", reason));
    }
    for (size_t c = 0; c < pod.container_index.size(); ++c) {
      std::vector<std::string> uuids;
      for (int32_t g : score->assignment.containers[c].gpus) {
        uuids.push_back(ns_it->second.uuids[g]);
      }
      annotations[absl::StrCat(vgpu::kAnnotationGpusPrefix, pod.container_index[c])] =
          absl::StrJoin(uuids, ",");
    }
    if (ns_it != nodes_.end()) {
      Booking b{node, ns, name, pod.request, score->assignment, pod.container_index, true, false};
      ApplyLocked(uid, std::move(b));
    }
  }
  if (asks_vgpu) {  // a pod without vGPU gets a plain Binding
    annotations[vgpu::kAnnotationNode] = node;
    annotations[vgpu::kAnnotationBindTime] =
        std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
    annotations[vgpu::kAnnotationAssigned] = "false";
  }
  // One write: the Binding carries the assignment, which the API server sets on the pod with
  // its node. The GPUs stay reserved here meanwhile, so binds on one node need no lock of
  // their own.
  if (absl::Status s = api_->CreateBinding(ns, name, uid, node, annotations); !s.ok()) {
    absl::MutexLock l(&mu_);
    if (BindMayHaveHappened(s)) {
      // The API server may have written the Binding and the answer been lost (a dropped
      // connection, a timeout, a 5xx after the write, or a 409 because our own first attempt
      // went through): the GPUs stay booked, as a reservation that the pod watch turns into the
      // pod's own booking when it shows the pod bound, or that expires. Releasing them here let
      // the next pod take GPUs the bound one holds (an API cut mid-burst over-committed one).
      if (bookings_.contains(uid)) {  // (a pod bound uncounted, above, holds nothing)
        reserved_[uid] = options_.clock->Now() + options_.reservation_ttl;
      }
    } else {
      ReleaseLocked(uid);
    }
    return error(std::string(s.message()));
  }
  spdlog::info("bound {}/{} to {}: {}", ns, name, node, annotations.dump());
  return error("");
}

void Extender::Register(httplib::Server& server, const std::string& prefix) {
  // cpp-httplib writes a response's headers and body separately: with Nagle on, the body waits
  // for the client's delayed ACK, ~40 ms per verb (measured). kube-scheduler (Go) sets
  // TCP_NODELAY on its side; we set it on ours.
  server.set_tcp_nodelay(true);
  auto verb = [this, &server, &prefix](const std::string& path,
                                       std::function<std::string(const json&)> fn) {
    server.Post(prefix + path, [this, fn](const httplib::Request& req, httplib::Response& res) {
      auto answer_error = [&res](int status, std::string_view why) {
        std::string out = R"({"Error":)";
        AppendQuoted(out, why);
        out += '}';
        res.status = status;
        res.set_content(out, "application/json");
      };
      if (!serving_) {
        absl::MutexLock l(&serving_mu_);
        return answer_error(503, not_serving_why_);
      }
      auto args = http::ParseUntrustedJson(req.body);
      if (!args.ok()) {
        return answer_error(absl::IsResourceExhausted(args.status()) ? 503 : 400,
                            absl::StrCat("request body: ", args.status().message()));
      }
      if (!args->value.is_object()) return answer_error(400, "request body is not a JSON object");
      try {
        res.set_content(fn(args->value), "application/json");
      } catch (const std::exception& e) {  // a shape no check foresaw: this request fails alone
        spdlog::error("extender {}: {}", req.path, e.what());
        answer_error(500, "internal error");
      }
    });
  };
  verb("/filter", [this](const json& a) { return FilterWire(a); });
  verb("/prioritize", [this](const json& a) { return PrioritizeWire(a); });
  verb("/bind", [this](const json& a) { return Bind(a).dump(); });
  server.Get(prefix + "/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  // The cluster's GPU layout and workload mix: only when asked for (--extender-debug-endpoints),
  // and then only on the authenticated (or loopback) extender listener.
  if (!options_.debug_endpoints) return;
  server.Get(prefix + "/state", [this](const httplib::Request&, httplib::Response& res) {
    placement::Cluster c = Snapshot();
    auto uuids = GpuUuids();
    json out = json::object();
    for (const auto& n : c.nodes) {
      json gpus = json::array();
      for (size_t g = 0; g < n.gpus.size(); ++g) {
        gpus.push_back({{"uuid", uuids[n.name][g]},
                        {"freeCores", n.gpus[g].free_milli / placement::kMilliPerVcudaCore},
                        {"freeMemoryUnits", vgpu::MemoryUnitsOf(n.gpus[g].memory_free_bytes)},
                        {"memoryUnits", vgpu::MemoryUnitsOf(n.gpus[g].memory_total_bytes)}});
      }
      out[n.name] = gpus;
    }
    res.set_content(out.dump(2), "application/json");
  });
  // The workload the fgd/gpulet policies score against: per class, its share of the pods seen.
  server.Get(prefix + "/workload", [this](const httplib::Request&, httplib::Response& res) {
    json out = json::array();
    for (const auto& c : workload().classes) {
      json containers = json::array();
      for (const auto& r : c.shape.containers) {
        containers.push_back(r.whole_gpus > 0
                                 ? json{{"cores", r.whole_gpus * vgpu::kCoresPerGpu}}
                                 : json{{"cores", r.milli / placement::kMilliPerVcudaCore}});
      }
      out.push_back({{"containers", containers}, {"weight", c.weight}});
    }
    res.set_content(out.dump(2), "application/json");
  });
}

void Extender::SetServing(bool on, const std::string& why) {
  {
    absl::MutexLock l(&serving_mu_);
    not_serving_why_ = why.empty() ? "gpulet extender: not serving" : why;
  }
  serving_ = on;
}

placement::Cluster Extender::Snapshot() const {
  absl::ReaderMutexLock l(&mu_);
  placement::Cluster c;
  for (const auto& [name, st] : nodes_) c.nodes.push_back(st.node);
  std::sort(c.nodes.begin(), c.nodes.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return c;
}

std::map<std::string, std::vector<std::string>> Extender::GpuUuids() const {
  absl::ReaderMutexLock l(&mu_);
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, st] : nodes_) out[name] = st.uuids;
  return out;
}

size_t Extender::booked_pods() const {
  absl::ReaderMutexLock l(&mu_);
  return bookings_.size();
}

}  // namespace gpulet::scheduler
