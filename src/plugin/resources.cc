#include "plugin/resources.h"

#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/status.h"
#include "gpu/device_nodes.h"
#include "plugin/topology.h"

namespace gpulet::plugin {
namespace {

constexpr char kMountRoot[] = "/var/run/nvidia-container-devices";
constexpr char kCdiKind[] = "nvidia.com/gpu";  // `gpulet cdi generate` (docs/runtime.md)
constexpr char kImexChannels[] = "/dev/nvidia-caps-imex-channels";

// One physical thing a container can be given: a whole GPU or one MIG device.
struct Unit {
  int gpu = 0;
  int mig = -1;
};

// What every resource of one node shares: read-only after construction.
struct Node {
  gpu::Inventory inv;
  Config cfg;
  const HealthMonitor* health = nullptr;
  std::unique_ptr<TopologyScorer> scorer;
  std::map<std::string, int> mig_minors;   // "gpu0/gi1/access" -> minor
  std::vector<std::string> control_nodes;  // /dev/nvidiactl, ... that exist on this host
  std::vector<std::string> imex_channels;  // imex.channelIDs whose device node exists

  std::string Uuid(const Unit& u) const {
    const auto& d = inv.devices[u.gpu];
    return u.mig < 0 ? d.uuid : d.mig_devices[u.mig].uuid;
  }
  std::string Index(const Unit& u) const {
    const auto& d = inv.devices[u.gpu];
    return u.mig < 0 ? std::to_string(d.index)
                     : gpu::MigIndexName(d.index, d.mig_devices[u.mig].index);
  }
  std::string Visible(const Unit& u) const {
    return cfg.id_strategy == IdStrategy::kIndex ? Index(u) : Uuid(u);
  }
};

// The device nodes of `units` (and the control nodes, MIG capability nodes) as device specs.
void DeviceSpecs(const Node& node, const std::vector<Unit>& units,
                 v1beta1::ContainerAllocateResponse* r) {
  const std::string root = node.cfg.DevRoot();
  auto add = [&](const std::string& p) {
    for (const auto& d : r->devices())
      if (d.container_path() == p) return;
    auto* d = r->add_devices();
    d->set_container_path(p);
    d->set_host_path(JoinRoot(root, p));
    d->set_permissions("rw");
  };
  for (const auto& p : node.control_nodes) add(p);
  for (const Unit& u : units) {
    const auto& d = node.inv.devices[u.gpu];
    add(gpu::GpuNode(d.minor));
    if (u.mig < 0) continue;
    // A MIG device also needs the capability nodes of its GPU and compute instance.
    const auto& m = d.mig_devices[u.mig];
    for (const auto& cap :
         gpu::MigCapabilityKeys(d.minor, m.gpu_instance_id, m.compute_instance_id)) {
      auto it = node.mig_minors.find(cap);
      if (it != node.mig_minors.end())
        add(gpu::CapabilityNode(it->second));
      else
        spdlog::warn("no {} in {}", cap, gpu::kMigMinorsFile);
    }
  }
}

// How `units` reach the container under the node's device-list strategies and passDeviceSpecs
// (`resource`: the resource name, for the annotation key).
void AddDevices(const Node& node, const std::string& resource, const std::vector<Unit>& units,
                v1beta1::ContainerAllocateResponse* r) {
  const Config& c = node.cfg;
  std::vector<std::string> visible;  // by the ID strategy
  for (const Unit& u : units) visible.push_back(node.Visible(u));
  auto& envs = *r->mutable_envs();
  const std::vector<std::string>& imex = node.imex_channels;
  if (!c.list.OnlyCdi()) {
    if (c.list.envvar) {
      envs["NVIDIA_VISIBLE_DEVICES"] = absl::StrJoin(visible, ",");
      if (!imex.empty()) envs["NVIDIA_IMEX_CHANNELS"] = absl::StrJoin(imex, ",");
    }
    if (c.list.volume_mounts) {
      envs["NVIDIA_VISIBLE_DEVICES"] = kMountRoot;
      for (const auto& v : visible) {
        auto* m = r->add_mounts();
        m->set_host_path("/dev/null");
        m->set_container_path(absl::StrCat(kMountRoot, "/", v));
      }
      for (const auto& id : imex) {
        auto* m = r->add_mounts();
        m->set_host_path("/dev/null");
        m->set_container_path(absl::StrCat(kMountRoot, "/imex/", id));
      }
    }
    if (c.pass_device_specs) {
      DeviceSpecs(node, units, r);
      for (const auto& id : imex) {
        auto* d = r->add_devices();
        d->set_container_path(absl::StrCat(kImexChannels, "/channel", id));
        d->set_host_path(JoinRoot(c.DevRoot(), d->container_path()));
        d->set_permissions("rw");
      }
    }
  }
  if (c.list.cdi_annotations || c.list.cdi_cri) {
    std::vector<std::string> names;
    for (const auto& v : visible) names.push_back(absl::StrCat(kCdiKind, "=", v));
    if (c.list.cdi_annotations) {
      // One key per resource: a container holding GPUs of two resources gets two annotations.
      std::string key = absl::StrCat(c.cdi_annotation_prefix, "gpulet-device-plugin_",
                                     resource.substr(resource.find('/') + 1));
      (*r->mutable_annotations())[key] = absl::StrJoin(names, ",");
    }
    if (c.list.cdi_cri)
      for (const auto& n : names) r->add_cdi_devices()->set_name(n);
  }
}

class NvidiaResource final : public kubelet::Resource {
 public:
  struct Entry {
    std::string id;
    Unit unit;
    int replica = -1;  // >= 0 for a time-slicing replica
  };

  NvidiaResource(std::string name, std::shared_ptr<const Node> node, std::vector<Entry> entries)
      : name_(std::move(name)), node_(std::move(node)), entries_(std::move(entries)) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      by_id_[entries_[i].id] = i;
      replicated_ |= entries_[i].replica >= 0;
      whole_gpus_ &= entries_[i].unit.mig < 0;
    }
    mps_ = replicated_ && node_->cfg.UsesMps();
  }

  const std::string& name() const override { return name_; }
  const kubelet::ChangeNotifier* changes() const override { return node_->health->changes(); }

  std::vector<kubelet::DeviceState> Devices() const override {
    std::vector<kubelet::DeviceState> out;
    out.reserve(entries_.size());
    for (const auto& e : entries_)
      out.push_back({e.id, node_->health->Healthy(e.unit.gpu, e.unit.mig),
                     node_->inv.devices[e.unit.gpu].numa_node});
    return out;
  }

  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& ids) override {
    if (ids.empty()) return absl::InvalidArgumentError("no device IDs in the request");
    std::vector<const Entry*> req;
    std::set<std::string> seen;
    for (const auto& id : ids) {
      ASSIGN_OR_RETURN(const Entry* e, Find(id));
      if (!seen.insert(id).second)
        return absl::InvalidArgumentError(
            absl::StrCat("device ID \"", id, "\" is requested twice"));
      std::string why = node_->health->Reason(e->unit.gpu, e->unit.mig);
      if (!why.empty())
        return absl::InvalidArgumentError(
            absl::StrCat("device ID \"", id, "\" of ", name_, " is Unhealthy: ", why));
      req.push_back(e);
    }
    if (replicated_ && node_->cfg.FailSharedRequestsGreaterThanOne() && ids.size() > 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid request: maximum request size for shared resource ", name_,
          " is 1 (failRequestsGreaterThanOne); device ID \"", ids[1], "\" is one too many"));
    // Replicas of one GPU are one device to the container.
    std::vector<Unit> units;
    for (const Entry* e : req)
      if (std::none_of(units.begin(), units.end(),
                       [&](const Unit& u) { return u.gpu == e->unit.gpu && u.mig == e->unit.mig; }))
        units.push_back(e->unit);
    // Index IDs are listed in index order (GPU, then MIG device): NVIDIA's plugin gives them in
    // Go's map order, random per call (so `2:1,1:0` and `1:0,2:1` both occur); gpulet gives the
    // one stable order. UUIDs keep the request's order, as NVIDIA's do.
    if (node_->cfg.id_strategy == IdStrategy::kIndex)
      std::sort(units.begin(), units.end(), [&](const Unit& a, const Unit& b) {
        const auto& da = node_->inv.devices[a.gpu];
        const auto& db = node_->inv.devices[b.gpu];
        auto mig = [](const gpu::Device& d, int m) {
          return m < 0 ? -1 : static_cast<int64_t>(d.mig_devices[m].index);
        };
        return std::make_pair(static_cast<int64_t>(da.index), mig(da, a.mig)) <
               std::make_pair(static_cast<int64_t>(db.index), mig(db, b.mig));
      });
    return Edits(units);
  }

  absl::StatusOr<std::vector<std::string>> Preferred(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must,
                                                     int size) override {
    if (size <= 0) return absl::InvalidArgumentError(absl::StrCat("allocation size ", size));
    std::vector<size_t> avail, required;
    std::set<size_t> seen;
    for (const auto& id : must) {
      ASSIGN_OR_RETURN(const Entry* e, Find(id));
      if (seen.insert(e - entries_.data()).second) required.push_back(e - entries_.data());
    }
    for (const auto& id : available) {
      ASSIGN_OR_RETURN(const Entry* e, Find(id));
      avail.push_back(e - entries_.data());
    }
    if (required.size() > static_cast<size_t>(size))
      return absl::InvalidArgumentError(absl::StrCat(required.size(), " must-include devices ",
                                                     "exceed the allocation size ", size));
    std::set<size_t> pool(avail.begin(), avail.end());
    pool.insert(required.begin(), required.end());
    if (pool.size() < static_cast<size_t>(size))
      return absl::InvalidArgumentError(
          absl::StrCat("allocation size ", size, " exceeds the ", pool.size(), " available"));
    std::vector<size_t> chosen =
        replicated_ ? Spread(pool, required, size)
                    : (whole_gpus_ ? Topo(pool, required, size) : Pack(pool, required, size));
    std::vector<std::string> out;
    for (size_t i : chosen) out.push_back(entries_[i].id);
    return out;
  }

 private:
  absl::StatusOr<const Entry*> Find(const std::string& id) const {
    auto it = by_id_.find(id);
    if (it == by_id_.end())
      return absl::InvalidArgumentError(
          absl::StrCat("unknown device ID \"", id, "\" for resource ", name_));
    return &entries_[it->second];
  }

  // Whole GPUs: the exact topology optimum.
  std::vector<size_t> Topo(const std::set<size_t>& pool, const std::vector<size_t>& required,
                           int size) const {
    uint64_t avail = 0, req = 0;
    std::map<int, size_t> entry_of;
    for (size_t i : pool)
      avail |= uint64_t{1} << entries_[i].unit.gpu, entry_of[entries_[i].unit.gpu] = i;
    for (size_t i : required) req |= uint64_t{1} << entries_[i].unit.gpu;
    auto best = node_->scorer->Best(avail, req, size);
    std::vector<size_t> out;
    if (!best.ok()) return out;  // unreachable: sizes were checked
    for (int g = 0; g < 64; ++g)
      if (*best >> g & 1) out.push_back(entry_of[g]);
    return out;
  }

  // Replicas: must-include first, then as NVIDIA's policy would, one at a time from the unit with
  // the fewest (distributed) or most (packed) replicas in use, counting those already picked. That
  // rule leaves ties; they go to the topology score of the resulting replica multiset (pairs of
  // replicas on two GPUs, as TopologyScorer::BestAddition), as whole GPUs are chosen:
  //  - distributed on whole GPUs: exact. Filling level by level, every unit at the lowest level is
  //    taken while the request has room for all of them; when it has room for only some, which
  //    ones is the one free choice, and BestAddition makes it;
  //  - packed, or units that are MIG devices (several per GPU): greedy, each pick the tied unit
  //    with the strongest links to what is already picked, then the first in ID order.
  std::vector<size_t> Spread(const std::set<size_t>& pool, const std::vector<size_t>& required,
                             int size) const {
    using Key = std::pair<int, int>;
    std::map<Key, int> used;
    std::map<Key, std::vector<size_t>> free;  // not yet picked, in ID order
    for (const auto& e : entries_) ++used[{e.unit.gpu, e.unit.mig}];
    std::set<size_t> req(required.begin(), required.end());
    for (size_t i : pool) {
      const Key k{entries_[i].unit.gpu, entries_[i].unit.mig};
      --used[k];
      if (!req.count(i)) free[k].push_back(i);
    }
    for (size_t i : required) ++used[{entries_[i].unit.gpu, entries_[i].unit.mig}];
    std::vector<size_t> out = required;
    std::vector<int> per_gpu(node_->inv.devices.size(), 0);  // picked replicas per GPU
    for (size_t i : required) ++per_gpu[entries_[i].unit.gpu];
    auto take = [&](const Key& k) {
      out.push_back(free[k].front());
      free[k].erase(free[k].begin());
      ++used[k];
      ++per_gpu[k.first];
    };
    auto gain = [&](int g) {
      int64_t v = 0;
      for (int h = 0; h < node_->scorer->size() && g < node_->scorer->size(); ++h)
        if (h != g) v += per_gpu[h] * node_->scorer->PairScore(g, h);
      return v;
    };
    const bool packed = node_->cfg.shared_policy == SharedPolicy::kPacked;
    int need = size - static_cast<int>(required.size());
    while (need > 0) {
      // The tied units: those the rule could pick next.
      std::vector<Key> tied;
      for (const auto& [k, f] : free) {
        if (f.empty()) continue;
        if (!tied.empty() && used[k] != used[tied[0]]) {
          if (packed ? used[k] < used[tied[0]] : used[k] > used[tied[0]]) continue;
          tied.clear();
        }
        tied.push_back(k);
      }
      if (!packed && static_cast<int>(tied.size()) <= need) {
        for (const Key& k : tied) take(k);
        need -= tied.size();
        continue;
      }
      const bool scored = std::all_of(
          tied.begin(), tied.end(), [&](const Key& k) { return k.first < node_->scorer->size(); });
      if (!packed && whole_gpus_ && scored) {
        uint64_t cand = 0;
        for (const Key& k : tied) cand |= uint64_t{1} << k.first;
        auto best = node_->scorer->BestAddition(cand, per_gpu, need);
        if (best.ok()) {
          for (const Key& k : tied)
            if (*best >> k.first & 1) take(k);
          break;
        }
      }
      const Key* pick = &tied[0];  // greedy (also the fallback past the scorer's 64 GPUs)
      for (const Key& k : tied)
        if (gain(k.first) > gain(pick->first)) pick = &k;
      take(*pick);
      --need;
    }
    return out;
  }

  // MIG devices: must-include first, then devices on GPUs already in the set, then on the GPU
  // with the most candidates (keeps other GPUs whole for larger requests).
  std::vector<size_t> Pack(const std::set<size_t>& pool, const std::vector<size_t>& required,
                           int size) const {
    std::map<int, int> per_gpu, in_set;
    for (size_t i : pool) ++per_gpu[entries_[i].unit.gpu];
    std::vector<size_t> out = required;
    std::set<size_t> taken(required.begin(), required.end());
    for (size_t i : required) ++in_set[entries_[i].unit.gpu];
    while (out.size() < static_cast<size_t>(size)) {
      size_t best = SIZE_MAX;
      auto key = [&](size_t i) {
        int g = entries_[i].unit.gpu;
        return std::make_pair(in_set[g], per_gpu[g]);
      };
      for (size_t i : pool)
        if (!taken.count(i) && (best == SIZE_MAX || key(i) > key(best))) best = i;
      taken.insert(best);
      out.push_back(best);
      ++in_set[entries_[best].unit.gpu];
    }
    return out;
  }

  v1beta1::ContainerAllocateResponse Edits(const std::vector<Unit>& units) const {
    const Config& c = node_->cfg;
    v1beta1::ContainerAllocateResponse r;
    if (mps_) {
      // As NVIDIA's: the daemon's pipe directory and the shared /dev/shm, whatever the strategy.
      const std::string pipe = MpsPipeDir(kMpsContainerRoot, name_);
      (*r.mutable_envs())["CUDA_MPS_PIPE_DIRECTORY"] = pipe;
      auto* m = r.add_mounts();
      m->set_container_path(pipe);
      m->set_host_path(MpsPipeDir(c.mps_root, name_));
      m = r.add_mounts();
      m->set_container_path("/dev/shm");
      m->set_host_path(MpsShmDir(c.mps_root));
    }
    auto& envs = *r.mutable_envs();
    // Whatever the strategy, as NVIDIA's (CDI strategies with these are refused at config load).
    if (c.gdrcopy) envs["NVIDIA_GDRCOPY"] = "enabled";
    if (c.gds) envs["NVIDIA_GDS"] = "enabled";
    if (c.mofed) envs["NVIDIA_MOFED"] = "enabled";
    AddDevices(*node_, name_, units, &r);
    return r;
  }

  const std::string name_;
  const std::shared_ptr<const Node> node_;
  const std::vector<Entry> entries_;
  std::map<std::string, size_t> by_id_;
  bool replicated_ = false;
  bool whole_gpus_ = true;
  bool mps_ = false;  // replicas of sharing.mps: Allocate adds the daemon's pipe and shm
};

bool Glob(const std::string& pattern, const std::string& s) {
  return ::fnmatch(pattern.c_str(), s.c_str(), 0) == 0;
}

// The node state every resource shares: the config, the MIG capability minors and the control and
// IMEX channel nodes that exist under `host_root`.
absl::StatusOr<std::shared_ptr<Node>> NewNode(const gpu::Inventory& inv, const Config& cfg,
                                              const HealthMonitor* health,
                                              const std::string& host_root) {
  auto node = std::make_shared<Node>();
  node->inv = inv;
  node->cfg = cfg;
  node->health = health;
  node->scorer = std::make_unique<TopologyScorer>(inv);
  RootedFilesystem host(host_root);
  if (auto text = host.ReadFile(gpu::kMigMinorsFile); text.ok())
    node->mig_minors = gpu::ParseMigMinors(*text);
  for (const char* p : gpu::kControlNodes)
    if (host.Exists(JoinRoot(cfg.DevRoot(), p))) node->control_nodes.push_back(p);
  // IMEX channels are injected only when their device node exists (as NVIDIA's); imex.required
  // makes a missing one an error.
  for (int id : cfg.imex_channels) {
    const std::string path = absl::StrCat(kImexChannels, "/channel", id);
    std::error_code ec;
    if (std::filesystem::is_character_file(JoinRoot(host_root, JoinRoot(cfg.DevRoot(), path)),
                                           ec)) {
      node->imex_channels.push_back(std::to_string(id));
    } else if (cfg.imex_required) {
      return absl::FailedPreconditionError(absl::StrCat("imex.required: IMEX channel ", path,
                                                        " does not exist (under nvidiaDevRoot ",
                                                        cfg.DevRoot(), ")"));
    } else {
      spdlog::warn("imex.channelIDs: {} does not exist; not injected", path);
    }
  }
  return node;
}

}  // namespace

std::string MigProfileName(const gpu::MigDevice& m) {
  if (m.ci_slices > 0 && m.ci_slices < m.gi_slices)
    return absl::StrCat(m.ci_slices, "c.", m.profile);
  return m.profile;
}

absl::StatusOr<std::vector<std::shared_ptr<kubelet::Resource>>> BuildResources(
    const gpu::Inventory& inv, const Config& cfg, const HealthMonitor* health,
    const std::string& host_root, std::vector<MpsShare>* mps) {
  ASSIGN_OR_RETURN(std::shared_ptr<Node> node, NewNode(inv, cfg, health, host_root));

  std::vector<NamedPattern> gpus = cfg.gpus, migs = cfg.migs;
  if (gpus.empty()) gpus.push_back({"*", "nvidia.com/gpu"});
  if (migs.empty() && cfg.mig_strategy == MigStrategy::kSingle)
    migs.push_back({"*", "nvidia.com/gpu"});

  // resource name -> units, in inventory order.
  std::map<std::string, std::vector<Unit>> units;
  bool any_whole = false, any_mig = false;
  std::string first_profile;
  for (const auto& d : inv.devices) {
    const int g = static_cast<int>(&d - inv.devices.data());
    if (!d.Readable()) {
      spdlog::warn("GPU {} cannot be read ({}); it offers nothing", d.index, d.error);
      continue;
    }
    if (d.mig_enabled && cfg.mig_strategy != MigStrategy::kNone) {
      if (d.mig_devices.empty()) {
        if (cfg.mig_strategy == MigStrategy::kSingle)
          return absl::FailedPreconditionError(absl::StrCat(
              "GPU ", d.index, " has MIG enabled but no MIG devices (migStrategy single)"));
        spdlog::warn("GPU {} has MIG enabled but no MIG devices; it offers nothing", d.index);
      }
      for (const auto& m : d.mig_devices) {
        const std::string profile = MigProfileName(m);
        if (cfg.mig_strategy == MigStrategy::kSingle) {
          if (first_profile.empty()) first_profile = profile;
          if (profile != first_profile)
            return absl::FailedPreconditionError(absl::StrCat(
                "migStrategy single needs one MIG profile on the node; found ", first_profile,
                " and ", profile, " (GPU ", d.index, "); use migStrategy mixed"));
        }
        std::string name;
        for (const auto& p : migs)
          if (Glob(p.pattern, profile)) {
            name = p.name;
            break;
          }
        if (name.empty() && cfg.migs.empty()) {
          name = "nvidia.com/mig-" + profile;
          std::replace(name.begin(), name.end(), '+', '.');
        }
        if (name.empty())
          return absl::InvalidArgumentError(absl::StrCat("MIG profile ", profile, " (GPU ", d.index,
                                                         ") matches no resources.mig pattern"));
        units[name].push_back({g, static_cast<int>(&m - d.mig_devices.data())});
        any_mig = true;
      }
      continue;
    }
    std::string name;
    for (const auto& p : gpus)
      if (Glob(p.pattern, d.name)) {
        name = p.name;
        break;
      }
    if (name.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("GPU ", d.index, " (", d.name, ") matches no resources.gpus pattern"));
    units[name].push_back({g, -1});
    any_whole = true;
  }
  if (cfg.mig_strategy == MigStrategy::kSingle && any_whole && any_mig)
    return absl::FailedPreconditionError(
        "migStrategy single: all GPUs must have the same MIG mode (some have MIG enabled, some "
        "not); use migStrategy mixed");

  auto id_of = [&](const Unit& u) {
    return cfg.checkpoint_id_strategy == IdStrategy::kIndex ? node->Index(u) : node->Uuid(u);
  };
  std::map<std::string, std::vector<NvidiaResource::Entry>> entries;
  std::set<std::string> shared_names;
  const char* sharing = cfg.UsesMps() ? "mps" : "timeSlicing";
  for (const auto& r : cfg.Shared()) {
    auto it = units.find(r.name);
    if (it == units.end()) {
      spdlog::warn("{}: no devices of {} on this node to share", r.where, r.name);
      continue;
    }
    if (!shared_names.insert(r.name).second)
      return absl::InvalidArgumentError(
          absl::StrCat(r.where, ": ", r.name, " is shared by two ", sharing, " entries"));
    std::vector<Unit>& pool = it->second;
    std::vector<bool> pick(pool.size(), r.all_devices);
    if (r.device_count > static_cast<int>(pool.size()))
      return absl::InvalidArgumentError(absl::StrCat(
          r.where, ": devices: ", r.device_count, " requested but ", r.name, " has ", pool.size()));
    for (int i = 0; i < r.device_count; ++i) pick[i] = true;
    for (const auto& want : r.device_list) {
      auto at = std::find_if(pool.begin(), pool.end(), [&](const Unit& u) {
        return node->Index(u) == want || node->Uuid(u) == want;
      });
      if (at == pool.end())
        return absl::InvalidArgumentError(
            absl::StrCat(r.where, ": devices: \"", want, "\" is not a device of ", r.name));
      pick[at - pool.begin()] = true;
    }
    const std::string name = r.rename.empty() ? r.name : r.rename;
    if (cfg.UsesMps()) {
      MpsShare share{name, {}, r.replicas};
      for (size_t i = 0; i < pool.size(); ++i) {
        if (!pick[i]) continue;
        const gpu::Device& d = inv.devices[pool[i].gpu];
        if (pool[i].mig >= 0)
          return absl::InvalidArgumentError(
              absl::StrCat(r.where, ": sharing.mps: ", r.name, " holds MIG devices (GPU ", d.index,
                           "); MPS does not share MIG devices (as NVIDIA's plugin)"));
        share.gpus.push_back({d.index, d.uuid, d.memory_bytes, d.cc_major, d.cc_minor});
      }
      if (absl::Status s = ValidateMpsShare(share); !s.ok())
        return absl::InvalidArgumentError(absl::StrCat(r.where, ": ", s.message()));
      if (mps) mps->push_back(std::move(share));
    }
    std::vector<Unit> keep;
    for (size_t i = 0; i < pool.size(); ++i) {
      if (!pick[i]) {
        keep.push_back(pool[i]);
        continue;
      }
      for (int n = 0; n < r.replicas; ++n)
        entries[name].push_back({absl::StrCat(id_of(pool[i]), "::", n), pool[i], n});
    }
    pool = std::move(keep);
  }
  for (const auto& [name, us] : units)
    for (const Unit& u : us) entries[name].push_back({id_of(u), u, -1});

  std::vector<std::shared_ptr<kubelet::Resource>> out;
  for (auto& [name, es] : entries) {
    if (es.empty()) continue;
    std::sort(es.begin(), es.end(), [](const auto& a, const auto& b) {
      return std::tie(a.unit.gpu, a.unit.mig, a.replica) <
             std::tie(b.unit.gpu, b.unit.mig, b.replica);
    });
    out.push_back(std::make_shared<NvidiaResource>(name, node, std::move(es)));
  }
  return out;
}

absl::StatusOr<GpuDelivery> MakeGpuDelivery(const gpu::Inventory& inv, const Config& cfg,
                                            const std::string& host_root,
                                            const std::string& resource) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Node> node, NewNode(inv, cfg, nullptr, host_root));
  return [node, resource](const std::vector<std::string>& uuids,
                          v1beta1::ContainerAllocateResponse* r) {
    std::vector<Unit> units;
    for (const auto& uuid : uuids)
      for (size_t g = 0; g < node->inv.devices.size(); ++g)
        if (node->inv.devices[g].uuid == uuid) units.push_back({static_cast<int>(g), -1});
    AddDevices(*node, resource, units, r);
  };
}

}  // namespace gpulet::plugin
