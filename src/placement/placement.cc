// Feasibility, state updates, workload classes and the cluster-wide decision loop.
#include "placement/placement.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "placement/internal.h"

namespace gpulet::placement {

int64_t PodRequest::TotalGpuMilli() const {
  int64_t total = 0;
  for (const auto& c : containers) {
    total += c.whole_gpus > 0 ? int64_t{c.whole_gpus} * kMilliPerGpu : c.milli;
  }
  return total;
}

namespace internal {

bool ModelAllowed(const PodRequest& pod, const std::string& model) {
  if (pod.gpu_models.empty()) return true;
  for (const auto& m : pod.gpu_models) {
    if (m == model) return true;
  }
  return false;
}

int SingleShareContainer(const PodRequest& pod) {
  int found = -1;
  for (int i = 0; i < static_cast<int>(pod.containers.size()); ++i) {
    const auto& c = pod.containers[i];
    if (c.whole_gpus > 0) return -1;
    if (c.milli > 0) {
      if (found >= 0) return -1;
      found = i;
    }
  }
  return found;
}

bool ShareFits(const Node& node, const PodRequest& pod, int c, int g) {
  const Gpu& gpu = node.gpus[g];
  const ContainerRequest& req = pod.containers[c];
  return gpu.healthy && gpu.fractional_allowed && gpu.free_milli >= req.milli &&
         (gpu.memory_total_bytes == 0 || gpu.memory_free_bytes >= req.memory_bytes) &&
         ModelAllowed(pod, gpu.model);
}

namespace {
bool WholeFree(const Gpu& gpu) {
  return gpu.healthy && gpu.free_milli == kMilliPerGpu &&
         (gpu.memory_total_bytes == 0 || gpu.memory_free_bytes == gpu.memory_total_bytes);
}
}  // namespace

bool PlanGreedy(const Node& node, const PodRequest& pod, Plan* plan, std::string* reason) {
  if (node.cpu_memory_binding && pod.cpu_milli > node.cpu_milli_free) {
    if (reason) {
      *reason = absl::StrCat("insufficient cpu: need ", pod.cpu_milli, "m, free ",
                             node.cpu_milli_free, "m");
    }
    return false;
  }
  if (node.cpu_memory_binding && pod.memory_mib > node.memory_mib_free) {
    if (reason) {
      *reason = absl::StrCat("insufficient memory: need ", pod.memory_mib, " MiB, free ",
                             node.memory_mib_free, " MiB");
    }
    return false;
  }
  if (plan) plan->clear();
  const int ngpu = static_cast<int>(node.gpus.size());
  // Compute and memory left per GPU while containers are placed one after another.
  absl::InlinedVector<int32_t, 8> free(ngpu);
  absl::InlinedVector<int64_t, 8> mem(ngpu);
  absl::InlinedVector<bool, 8> allowed(ngpu);
  bool any_model = false;
  for (int g = 0; g < ngpu; ++g) {
    free[g] = node.gpus[g].free_milli;
    mem[g] = node.gpus[g].memory_free_bytes;
    allowed[g] = ModelAllowed(pod, node.gpus[g].model);
    any_model = any_model || allowed[g];
  }
  const int nc = static_cast<int>(pod.containers.size());
  bool needs_gpu = false;
  for (const auto& c : pod.containers) needs_gpu = needs_gpu || c.whole_gpus > 0 || c.milli > 0;
  if (needs_gpu && !any_model) {
    if (reason) {
      *reason = absl::StrCat("no GPU of model ", absl::StrJoin(pod.gpu_models, "|"),
                             ngpu == 0 ? " (node has no GPU)" : "");
    }
    return false;
  }
  // Whole GPUs first: they need untouched GPUs, and whole-only GPUs are useless to shares.
  for (int c = 0; c < nc; ++c) {
    int need = pod.containers[c].whole_gpus;
    for (int pass = 0; pass < 2 && need > 0; ++pass) {
      for (int g = 0; g < ngpu && need > 0; ++g) {
        const Gpu& gpu = node.gpus[g];
        if (gpu.fractional_allowed != (pass == 1) || !allowed[g] || free[g] != kMilliPerGpu ||
            !WholeFree(gpu)) {
          continue;
        }
        free[g] = 0;
        mem[g] = 0;
        --need;
        if (plan) plan->push_back({c, g, kMilliPerGpu, 0, true});
      }
    }
    if (need > 0) {
      if (reason) {
        int whole = 0;
        for (int g = 0; g < ngpu; ++g) whole += allowed[g] && WholeFree(node.gpus[g]);
        *reason =
            absl::StrCat("needs ", pod.containers[c].whole_gpus, " whole GPU(s), ", whole, " free");
      }
      return false;
    }
  }
  for (int c = 0; c < nc; ++c) {
    const ContainerRequest& req = pod.containers[c];
    if (req.whole_gpus > 0 || req.milli <= 0) continue;
    int best = -1;
    for (int g = 0; g < ngpu; ++g) {
      const Gpu& gpu = node.gpus[g];
      if (!gpu.healthy || !gpu.fractional_allowed || !allowed[g] || free[g] < req.milli) continue;
      if (gpu.memory_total_bytes != 0 && mem[g] < req.memory_bytes) continue;
      if (best < 0 || free[g] < free[best]) best = g;
    }
    if (best < 0) {
      if (reason) {
        int32_t largest = 0;
        for (int g = 0; g < ngpu; ++g) {
          if (allowed[g] && node.gpus[g].healthy && node.gpus[g].fractional_allowed) {
            largest = std::max(largest, free[g]);
          }
        }
        *reason = absl::StrCat(
            "no GPU with ", req.milli, " milli",
            req.memory_bytes ? absl::StrCat(" and ", req.memory_bytes, " bytes memory") : "",
            " free (largest free share: ", largest, " milli)");
      }
      return false;
    }
    free[best] -= req.milli;
    mem[best] -= req.memory_bytes;
    if (plan) plan->push_back({c, best, req.milli, req.memory_bytes, false});
  }
  return true;
}

Assignment ToAssignment(const PodRequest& pod, const Plan& plan) {
  Assignment a;
  a.containers.resize(pod.containers.size());
  for (const Take& t : plan) {
    auto& ca = a.containers[t.container];
    ca.gpus.push_back(t.gpu);
    ca.milli = t.milli;
    ca.memory_bytes = t.memory;
  }
  return a;
}

std::optional<double> PolicyImpl::ScorePlan(const Node& node, const PodRequest& pod, Plan* plan,
                                            const ClusterFree* cluster) const {
  if (!PlanGreedy(node, pod, plan, nullptr)) return std::nullopt;
  Context ctx;
  ctx.cluster = cluster;
  const int c = SingleShareContainer(pod);
  if (c < 0 || !TriesEveryGpu()) return Evaluate(node, pod, *plan, ctx);
  // Every GPU the share fits on; GPUs in the same state give the same score, so only the
  // first of each (free compute, free memory) pair is evaluated.
  std::optional<double> best;
  int best_gpu = -1;
  Plan candidate = *plan;
  const int ngpu = static_cast<int>(node.gpus.size());
  for (int g = 0; g < ngpu; ++g) {
    if (!ShareFits(node, pod, c, g)) continue;
    bool seen = false;
    for (int h = 0; h < g && !seen; ++h) {
      seen = node.gpus[h].free_milli == node.gpus[g].free_milli &&
             node.gpus[h].memory_free_bytes == node.gpus[g].memory_free_bytes &&
             node.gpus[h].model == node.gpus[g].model && ShareFits(node, pod, c, h);
    }
    if (seen) continue;
    candidate[0].gpu = g;
    double s = Evaluate(node, pod, candidate, ctx);
    if (!best || s > *best) {
      best = s;
      best_gpu = g;
    }
  }
  (*plan)[0].gpu = best_gpu;
  return best;
}

std::optional<NodeScore> PolicyImpl::Score(const Node& node, const PodRequest& pod) const {
  Plan plan;
  auto s = ScorePlan(node, pod, &plan, nullptr);
  if (!s) return std::nullopt;
  return NodeScore{*s, ToAssignment(pod, plan)};
}

}  // namespace internal

void ClusterFree::Add(const Node& node) {
  int64_t gpu = 0;
  for (const Gpu& g : node.gpus) gpu += g.healthy ? g.free_milli : 0;
  if (gpu <= 0) return;
  gpu_milli += static_cast<double>(gpu);
  cpu_milli += static_cast<double>(std::max<int64_t>(0, node.cpu_milli_free));
  memory_mib += static_cast<double>(std::max<int64_t>(0, node.memory_mib_free));
}

ClusterFree FreeOf(const Cluster& cluster) {
  ClusterFree f;
  for (const Node& n : cluster.nodes) f.Add(n);
  return f;
}

bool Fits(const Node& node, const PodRequest& pod, std::string* reason) {
  return internal::PlanGreedy(node, pod, nullptr, reason);
}

namespace {

// Checks `assignment` against `pod` and `node` and computes the per-GPU changes; sign = +1 to
// take (Apply), -1 to give back (Release).
absl::Status Update(Node& node, const PodRequest& pod, const Assignment& a, int sign) {
  const char* verb = sign > 0 ? "apply" : "release";
  if (a.containers.size() != pod.containers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(verb, " pod ", pod.name, " on ", node.name, ": ", a.containers.size(),
                     " container assignments for ", pod.containers.size(), " containers"));
  }
  const int ngpu = static_cast<int>(node.gpus.size());
  std::vector<int32_t> free(ngpu);
  std::vector<int64_t> mem(ngpu);
  for (int g = 0; g < ngpu; ++g) {
    free[g] = node.gpus[g].free_milli;
    mem[g] = node.gpus[g].memory_free_bytes;
  }
  auto fail = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat(verb, " pod ", pod.name, " on ", node.name, ": ", what));
  };
  for (size_t c = 0; c < pod.containers.size(); ++c) {
    const ContainerRequest& req = pod.containers[c];
    const ContainerAssignment& ca = a.containers[c];
    const size_t want = req.whole_gpus > 0 ? req.whole_gpus : (req.milli > 0 ? 1 : 0);
    if (ca.gpus.size() != want) {
      return fail(absl::StrCat("container ", c, " needs ", want, " GPU(s), assignment has ",
                               ca.gpus.size()));
    }
    for (int32_t g : ca.gpus) {
      if (g < 0 || g >= ngpu) return fail(absl::StrCat("GPU index ", g, " out of range"));
      const Gpu& gpu = node.gpus[g];
      if (req.whole_gpus > 0) {
        if (sign > 0) {
          if (!gpu.healthy || free[g] != kMilliPerGpu ||
              (gpu.memory_total_bytes != 0 && mem[g] != gpu.memory_total_bytes)) {
            return fail(absl::StrCat("GPU ", g, " is not wholly free"));
          }
          free[g] = 0;
          mem[g] = 0;
        } else {
          if (free[g] != 0) return fail(absl::StrCat("GPU ", g, " is not held whole"));
          free[g] = kMilliPerGpu;
          mem[g] = gpu.memory_total_bytes;
        }
      } else {
        if (sign > 0 && (!gpu.healthy || !gpu.fractional_allowed)) {
          return fail(absl::StrCat("GPU ", g, " takes no shares"));
        }
        free[g] -= sign * req.milli;
        if (gpu.memory_total_bytes != 0) mem[g] -= sign * req.memory_bytes;
        if (free[g] < 0 || free[g] > kMilliPerGpu || mem[g] < 0 ||
            (gpu.memory_total_bytes != 0 && mem[g] > gpu.memory_total_bytes)) {
          return fail(absl::StrCat("GPU ", g, sign > 0 ? " lacks " : " does not hold ", req.milli,
                                   " milli / ", req.memory_bytes, " bytes"));
        }
      }
      if ((req.whole_gpus > 0 || req.milli > 0) && !internal::ModelAllowed(pod, gpu.model)) {
        return fail(absl::StrCat("GPU ", g, " model ", gpu.model, " not accepted"));
      }
    }
  }
  const int64_t cpu = node.cpu_milli_free - sign * pod.cpu_milli;
  const int64_t memory = node.memory_mib_free - sign * pod.memory_mib;
  if (node.cpu_memory_binding) {
    if (cpu < 0 || memory < 0) return fail("insufficient cpu or memory");
    if (cpu > node.cpu_milli_total || memory > node.memory_mib_total) {
      return fail("cpu or memory not held");
    }
  }
  node.cpu_milli_free = cpu;
  node.memory_mib_free = memory;
  for (int g = 0; g < ngpu; ++g) {
    node.gpus[g].free_milli = free[g];
    node.gpus[g].memory_free_bytes = mem[g];
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Apply(Node& node, const PodRequest& pod, const Assignment& assignment) {
  return Update(node, pod, assignment, +1);
}
absl::Status Release(Node& node, const PodRequest& pod, const Assignment& assignment) {
  return Update(node, pod, assignment, -1);
}

Workload WorkloadFromPods(std::span<const PodRequest> pods, double coverage) {
  // Key: cpu, per-container (whole, milli), models. Memory is deliberately not part of it.
  using Key =
      std::tuple<int64_t, std::vector<std::pair<int32_t, int32_t>>, std::vector<std::string>>;
  std::map<Key, std::pair<const PodRequest*, int64_t>> counts;
  std::map<Key, int64_t> mem_sum;
  for (const PodRequest& p : pods) {
    std::vector<std::pair<int32_t, int32_t>> gpu;
    for (const auto& c : p.containers) {
      if (c.whole_gpus > 0 || c.milli > 0) gpu.emplace_back(c.whole_gpus, c.milli);
    }
    std::vector<std::string> models = p.gpu_models;
    std::sort(models.begin(), models.end());
    models.erase(std::unique(models.begin(), models.end()), models.end());
    auto [it, inserted] = counts.try_emplace(Key{p.cpu_milli, gpu, models}, &p, 0);
    ++it->second.second;
    mem_sum[it->first] += p.memory_mib;
  }
  std::vector<std::pair<int64_t, const Key*>> order;
  for (const auto& [k, v] : counts) order.emplace_back(v.second, &k);
  // Most frequent first; equal counts in a fixed order (larger shapes first).
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return *b.second < *a.second;
  });
  Workload w;
  const double total = static_cast<double>(pods.size());
  double cum = 0;
  for (const auto& [n, key] : order) {
    if (cum >= coverage * total) break;
    cum += n;
    WorkloadClass cls;
    const PodRequest& example = *counts.at(*key).first;
    cls.shape.name = example.name;
    cls.shape.cpu_milli = std::get<0>(*key);
    for (const auto& [whole, milli] : std::get<1>(*key)) {
      cls.shape.containers.push_back({whole, whole > 0 ? 0 : milli, 0});
    }
    cls.shape.gpu_models = std::get<2>(*key);
    cls.weight = n / total;
    cls.shape.memory_mib = mem_sum.at(*key) / n;  // mean; FGD's measure ignores it
    w.classes.push_back(std::move(cls));
  }
  for (auto& c : w.classes) c.weight = c.weight * total / cum;
  return w;
}

namespace {

// Hash of everything a state-only policy looks at; SameState() confirms a hash match.
uint64_t StateHash(const Node& n) {
  uint64_t h = static_cast<uint64_t>(n.cpu_milli_free) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(n.memory_mib_free);
  for (const Gpu& g : n.gpus) {
    h = (h ^ static_cast<uint64_t>(g.free_milli) ^ (static_cast<uint64_t>(g.healthy) << 20) ^
         (static_cast<uint64_t>(g.fractional_allowed) << 21) ^
         (static_cast<uint64_t>(g.memory_free_bytes) << 22) ^ (g.model.size() << 40) ^
         (g.model.empty()
              ? 0
              : static_cast<uint64_t>(static_cast<unsigned char>(g.model.back())) << 48)) *
        0x100000001B3ull;
  }
  return h;
}

bool SameState(const Node& a, const Node& b) {
  if (a.cpu_milli_free != b.cpu_milli_free || a.memory_mib_free != b.memory_mib_free ||
      a.cpu_milli_total != b.cpu_milli_total || a.memory_mib_total != b.memory_mib_total ||
      a.gpus.size() != b.gpus.size()) {
    return false;
  }
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    const Gpu& x = a.gpus[i];
    const Gpu& y = b.gpus[i];
    if (x.free_milli != y.free_milli || x.memory_free_bytes != y.memory_free_bytes ||
        x.memory_total_bytes != y.memory_total_bytes || x.healthy != y.healthy ||
        x.fractional_allowed != y.fractional_allowed || x.model != y.model) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<Choice> Schedule(const Cluster& cluster, const PodRequest& pod, const Policy& policy,
                                uint64_t* tie_rng) {
  const auto* impl = dynamic_cast<const internal::PolicyImpl*>(&policy);
  Choice best;
  double best_score = 0;
  int64_t ties = 0;
  internal::Plan plan, best_plan;
  const int n = static_cast<int>(cluster.nodes.size());
  const ClusterFree free = FreeOf(cluster);
  // Nodes in identical states get identical scores: score the first of each state only.
  const bool memo_on = impl && impl->StateOnly();
  absl::flat_hash_map<uint64_t, int> memo;  // state hash -> memo_entries index
  struct MemoEntry {
    int node;
    std::optional<double> score;
    internal::Plan plan;
  };
  std::vector<MemoEntry> memo_entries;
  if (memo_on) memo.reserve(n);
  for (int i = 0; i < n; ++i) {
    const Node& node = cluster.nodes[i];
    std::optional<double> s;
    std::optional<NodeScore> full;
    if (impl && memo_on) {
      const uint64_t h = StateHash(node);
      auto [it, inserted] = memo.try_emplace(h, static_cast<int>(memo_entries.size()));
      if (!inserted && SameState(cluster.nodes[memo_entries[it->second].node], node)) {
        s = memo_entries[it->second].score;
        plan = memo_entries[it->second].plan;
      } else {
        s = impl->ScorePlan(node, pod, &plan, &free);
        if (inserted) memo_entries.push_back({i, s, plan});
      }
    } else if (impl) {
      s = impl->ScorePlan(node, pod, &plan, &free);
    } else {
      full = policy.Score(node, pod);
      if (full) s = full->score;
    }
    if (!s) continue;
    bool take = false;
    if (best.node < 0 || *s > best_score) {
      take = true;
      ties = 1;
    } else if (*s == best_score && tie_rng) {
      ++ties;
      take = internal::Uniform(*tie_rng, ties) == 0;  // reservoir sampling over the tied nodes
    }
    if (!take) continue;
    best.node = i;
    best_score = *s;
    if (impl) {
      best_plan = plan;
    } else {
      best.placement = std::move(*full);
    }
  }
  if (best.node < 0) {
    std::vector<std::string> why;
    for (int i = 0; i < n && why.size() < 3; ++i) {
      std::string r;
      if (!Fits(cluster.nodes[i], pod, &r))
        why.push_back(absl::StrCat(cluster.nodes[i].name, ": ", r));
    }
    return absl::NotFoundError(absl::StrCat("no node fits pod ", pod.name, " (", n, " nodes",
                                            why.empty() ? "" : "; ", absl::StrJoin(why, "; "),
                                            n > 3 ? "; ..." : "", ")"));
  }
  best.placement.score = best_score;
  if (impl) best.placement.assignment = internal::ToAssignment(pod, best_plan);
  return best;
}

std::vector<int64_t> ScaleScores(std::span<const double> scores, int64_t lo, int64_t hi) {
  std::vector<int64_t> out(scores.size(), hi);
  if (scores.empty()) return out;
  const auto [mn, mx] = std::minmax_element(scores.begin(), scores.end());
  if (*mx == *mn) return out;
  for (size_t i = 0; i < scores.size(); ++i) {
    const double f = (scores[i] - *mn) / (*mx - *mn);
    // Kept as written so scores stay bit-identical to the published simulation results.
    // NOLINTNEXTLINE(bugprone-incorrect-roundings): f >= 0 here, so + 0.5 does round
    out[i] = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo) + 0.5);
  }
  return out;
}

}  // namespace gpulet::placement
