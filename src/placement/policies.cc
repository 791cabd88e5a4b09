// The built-in placement policies and their registry.
//
// The baselines follow the definitions of the FGD paper's simulator (Weng et al., "Beware of
// Fragmentation", USENIX ATC'23; hkust-adsl/kubernetes-scheduler-simulator), including its
// integer 0..100 node scores -- kube-scheduler plugins return integers, and the resulting ties are
// part of how those policies behave (the simulator breaks them at random, like selectHost).
// The constants 128000 milli-CPU and 8000 milli-GPU are that simulator's "max node spec" used to
// normalise CPU and GPU onto one scale.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "placement/internal.h"

namespace gpulet::placement {
namespace {

using internal::Plan;
using internal::PolicyImpl;
using internal::Take;

constexpr double kMaxSpecCpu = 128000;  // milli-CPU
constexpr double kMaxSpecGpu = 8000;    // milli-GPU

int64_t NodeGpuFree(const Node& node) {
  int64_t total = 0;
  for (const Gpu& g : node.gpus) total += g.healthy ? g.free_milli : 0;
  return total;
}

// The paper simulator's best-fit score: 100 x (1 - leftover), leftover = half normalised free CPU
// plus half normalised free GPU after placing; integer levels.
double BestFitScore(const Node& node, const PodRequest& pod) {
  const double left = 0.5 * (node.cpu_milli_free - pod.cpu_milli) / kMaxSpecCpu +
                      0.5 * (NodeGpuFree(node) - pod.TotalGpuMilli()) / kMaxSpecGpu;
  return std::trunc((1.0 - left) * 100);
}

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0x9E3779B97F4A7C15ull);
  return internal::SplitMix(s);
}

// Random: a uniformly random feasible node and GPU, reproducible per (seed, pod, node).
class RandomPolicy final : public PolicyImpl {
 public:
  explicit RandomPolicy(uint64_t seed) : seed_(seed) {}
  std::string_view name() const override { return "random"; }
  bool StateOnly() const override { return false; }

 protected:
  bool TriesEveryGpu() const override { return true; }
  double Evaluate(const Node& node, const PodRequest& pod, const Plan& plan,
                  Context&) const override {
    const uint64_t h =
        Mix(Mix(seed_, std::hash<std::string>{}(pod.name)), std::hash<std::string>{}(node.name));
    // Node part: an integer 0..99 like kube-scheduler's score; GPU part below 1 picks the GPU.
    double s = static_cast<double>(h % 100);
    if (!plan.empty()) s += static_cast<double>(Mix(h, plan[0].gpu) >> 11) * 0x1p-53;
    return s;
  }

 private:
  uint64_t seed_;
};

// Best fit: the node left with the least CPU and GPU (each normalised by the max node spec).
class BestFitPolicy final : public PolicyImpl {
 public:
  std::string_view name() const override { return "best-fit"; }

 protected:
  double Evaluate(const Node& node, const PodRequest& pod, const Plan&, Context&) const override {
    return BestFitScore(node, pod);
  }
};

// Dot product (Tetris): the node whose free (CPU, GPU) vector is least aligned with the request.
class DotProductPolicy final : public PolicyImpl {
 public:
  std::string_view name() const override { return "dot-product"; }

 protected:
  double Evaluate(const Node& node, const PodRequest& pod, const Plan&, Context&) const override {
    const double dot = (node.cpu_milli_free / kMaxSpecCpu) * (pod.cpu_milli / kMaxSpecCpu) +
                       (NodeGpuFree(node) / kMaxSpecGpu) * (pod.TotalGpuMilli() / kMaxSpecGpu);
    return std::trunc((1.0 - dot / 2) * 100);
  }
};

// GPU packing: prefer shared GPUs already in use, then free GPUs on used nodes, then idle nodes.
class GpuPackingPolicy final : public PolicyImpl {
 public:
  std::string_view name() const override { return "gpu-packing"; }

 protected:
  double Evaluate(const Node& node, const PodRequest& pod, const Plan& plan,
                  Context&) const override {
    if (pod.TotalGpuMilli() == 0) return 0;
    int fully_free = 0, healthy = 0;
    for (const Gpu& g : node.gpus) {
      healthy += g.healthy;
      fully_free += g.healthy && g.free_milli == kMilliPerGpu;
    }
    if (fully_free == healthy) return std::max(100 / 3 - fully_free, fully_free);
    int used_free = 0;
    int64_t free_pct_on_used = 0;
    for (const Take& t : plan) {
      const int32_t f = node.gpus[t.gpu].free_milli;
      if (f == kMilliPerGpu) ++used_free;
      free_pct_on_used += f * 100 / kMilliPerGpu;
    }
    if (used_free > 0) return std::max(100 / 2 - used_free, 100 / 3);
    return std::max<int64_t>(100 - free_pct_on_used / 10, 100 / 2);
  }
};

// Fragmentation of a node as seen by a workload (the FGD paper's measure): for every workload
// class m with weight p_m, the node's free GPU compute that m cannot use -- all of it when m does
// not fit the node at all (CPU, GPU count/share, model), else the GPUs with less free than m
// asks -- summed as sum_m p_m * frag_m. Like the paper, node memory is not part of the measure
// (Fits() still checks it).
class FragModel {
  struct Class;
  struct Group;

 public:
  void Set(const Workload& w) {
    classes_.clear();
    model_bit_.clear();
    for (const WorkloadClass& wc : w.classes) {
      Class c;
      c.p = wc.weight;
      c.cpu = wc.shape.cpu_milli;
      for (const auto& k : wc.shape.containers) {
        if (k.whole_gpus > 0) {
          c.num += k.whole_gpus;
          c.milli = kMilliPerGpu;
        } else if (k.milli > 0) {
          c.num += 1;
          c.milli = std::max(c.milli, k.milli);
        }
      }
      for (const std::string& m : wc.shape.gpu_models) {
        auto [it, inserted] = model_bit_.try_emplace(m, model_bit_.size());
        if (it->second < 64) c.models |= uint64_t{1} << it->second;
      }
      if (wc.shape.gpu_models.empty() || c.models == 0) c.models = ~uint64_t{0};
      classes_.push_back(c);
    }
    std::stable_sort(classes_.begin(), classes_.end(),
                     [](const Class& a, const Class& b) { return a.milli < b.milli; });
    BuildGroups();
  }
  bool empty() const { return classes_.empty(); }

  using State = internal::FragState;
  State StateOf(const Node& node) const {
    State s;
    s.cpu = node.cpu_milli_free;
    for (const Gpu& g : node.gpus) {
      if (!g.healthy || s.n == static_cast<int>(s.free.size())) continue;
      s.free[s.n++] = g.free_milli;
      auto it = model_bit_.find(g.model);
      s.models |= (it != model_bit_.end() && it->second < 63) ? uint64_t{1} << it->second
                                                              : uint64_t{1} << 63;
    }
    return s;
  }

  double Frag(const State& s) const {
    return use_groups_ && InRange(s) ? FragByGroups(s) : FragByClasses(s);
  }

  // The measure class by class, as defined above: O(classes) per call, plus a sort.
  double FragByClasses(State s) const {
    std::sort(s.free.begin(), s.free.begin() + s.n);
    int64_t total = 0;
    int nfull = 0;
    for (int i = 0; i < s.n; ++i) {
      total += s.free[i];
      nfull += s.free[i] == kMilliPerGpu;
    }
    if (total == 0) return 0;
    const int32_t maxfree = s.n ? s.free[s.n - 1] : 0;
    double frag = 0;
    int j = 0;
    int64_t below = 0;  // free compute on GPUs with less free than the current class asks
    for (const Class& c : classes_) {
      bool fits = c.num > 0 && (c.models & s.models) != 0 && s.cpu >= c.cpu;
      if (fits) fits = c.milli < kMilliPerGpu && c.num == 1 ? maxfree >= c.milli : nfull >= c.num;
      if (!fits) {
        frag += c.p * static_cast<double>(total);
        continue;
      }
      while (j < s.n && s.free[j] < c.milli) below += s.free[j++];
      frag += c.p * static_cast<double>(below);
    }
    return frag;
  }

  // The same measure, O(groups x GPUs) per call: the extender scores every GPU of every node
  // for each pod (8000 evaluations at 1000 nodes), and its workload is a few dozen share classes
  // that differ only in milli, so summing class by class dominated its decision time.
  // Classes are grouped by what gates them at node level (CPU asked, models). Within a group, a
  // share class c (one GPU, x_c < 1000 milli) that fits (x_c <= maxfree) adds p_c * (free compute
  // on GPUs with less free than x_c); summed over those classes that is
  //   sum_j f_j * (P(maxfree) - P(f_j))   over GPUs j with f_j < maxfree,
  // where P(x) is the group's total share-class weight with x_c <= x (a table over 0..1000);
  // classes with x_c > maxfree add their weight times all free compute. Whole-GPU and
  // multi-container classes are few and are summed one by one.
  double FragByGroups(const State& s) const {
    int64_t total = 0;
    int nfull = 0;
    int32_t maxfree = 0;
    for (int i = 0; i < s.n; ++i) {
      total += s.free[i];
      nfull += s.free[i] == kMilliPerGpu;
      maxfree = std::max(maxfree, s.free[i]);
    }
    if (total == 0) return 0;
    const double t = static_cast<double>(total);
    double frag = 0;
    for (const Group& g : groups_) {
      frag += (g.models & s.models) == 0 || s.cpu < g.cpu ? g.weight * t
                                                          : GroupFrag(g, s, maxfree, nfull, t);
    }
    return frag;
  }

  // One group's part when its node-level gate (models, CPU) is open; `maxfree`, `nfull` and `t`
  // are the state's largest free share, whole free GPUs and total free compute.
  double GroupFrag(const Group& g, const State& s, int32_t maxfree, int nfull, double t) const {
    double frag = ShareFrag(g, s, maxfree, t) + g.no_gpu_weight * t;
    for (const Class& c : g.multi) frag += MultiFrag(c, s, nfull, t);
    return frag;
  }
  static double ShareFrag(const Group& g, const State& s, int32_t maxfree, double t) {
    const double* le = g.share_le.data();
    double share = 0;
    for (int i = 0; i < s.n; ++i) {
      if (s.free[i] < maxfree) share += s.free[i] * (le[maxfree] - le[s.free[i]]);
    }
    return share + t * (le[kMilliPerGpu] - le[maxfree]);
  }
  static double MultiFrag(const Class& c, const State& s, int nfull, double t) {
    if (nfull < c.num) return c.p * t;
    int64_t below = 0;
    for (int i = 0; i < s.n; ++i) below += s.free[i] < c.milli ? s.free[i] : 0;
    return c.p * static_cast<double>(below);
  }

  // before - Frag(after placing `pod` as `plan`), where `before` is Frag(s). When the plan
  // changes one GPU (a share: what the extender scores on every GPU of every node), only that
  // GPU's terms are recomputed, group by group; a group is summed afresh only when the change
  // moves what gates it (CPU, the largest free share, the count of whole free GPUs).
  double Decrease(const State& s, double before, const PodRequest& pod, const Plan& plan,
                  const Node& node) const {
    if (!use_groups_ || plan.size() != 1 || !InRange(s)) {
      return before - FragAfter(s, pod, plan, node);
    }
    int j = 0;
    for (int g = 0; g < plan[0].gpu; ++g) j += node.gpus[g].healthy;
    if (j >= s.n) return before - FragAfter(s, pod, plan, node);
    const int32_t f = s.free[j], f2 = f - plan[0].milli;
    if (f2 < 0) return before - FragAfter(s, pod, plan, node);
    int64_t total = 0;
    int nfull = 0, at_max = 0;
    int32_t m = 0;
    for (int i = 0; i < s.n; ++i) {
      total += s.free[i];
      nfull += s.free[i] == kMilliPerGpu;
      if (s.free[i] > m) {
        m = s.free[i];
        at_max = 0;
      }
      at_max += s.free[i] == m;
    }
    const int64_t total2 = total - (f - f2);
    if (total == 0) return before - FragAfter(s, pod, plan, node);
    if (total2 == 0) return before;  // nothing left free: no fragmentation after
    State s2 = s;
    s2.cpu -= pod.cpu_milli;
    s2.free[j] = f2;
    int32_t m2 = m;
    if (f == m && at_max == 1) {
      m2 = 0;
      for (int i = 0; i < s.n; ++i) m2 = std::max(m2, s2.free[i]);
    }
    const int nfull2 = nfull - (f == kMilliPerGpu && f2 != kMilliPerGpu);
    const double t = static_cast<double>(total), t2 = static_cast<double>(total2);
    double d = 0;
    for (const Group& g : groups_) {
      const bool model_ok = (g.models & s.models) != 0;
      const bool open = model_ok && s.cpu >= g.cpu, open2 = model_ok && s2.cpu >= g.cpu;
      if (!open && !open2) {
        d += g.weight * (t - t2);
        continue;
      }
      if (open != open2) {
        d += (open ? GroupFrag(g, s, m, nfull, t) : g.weight * t) -
             (open2 ? GroupFrag(g, s2, m2, nfull2, t2) : g.weight * t2);
        continue;
      }
      const double* le = g.share_le.data();
      if (m2 == m) {
        const double before_j = f < m ? f * (le[m] - le[f]) : 0;
        const double after_j = f2 < m ? f2 * (le[m] - le[f2]) : 0;
        d += before_j - after_j + (t - t2) * (le[kMilliPerGpu] - le[m]);
      } else {
        d += ShareFrag(g, s, m, t) - ShareFrag(g, s2, m2, t2);
      }
      d += g.no_gpu_weight * (t - t2);
      for (const Class& c : g.multi) {
        if (nfull >= c.num && nfull2 >= c.num) {
          d += c.p * ((f < c.milli ? f : 0) - (f2 < c.milli ? f2 : 0));
        } else {
          d += MultiFrag(c, s, nfull, t) - MultiFrag(c, s2, nfull2, t2);
        }
      }
    }
    return d;
  }

  // Fragmentation after placing `pod` as `plan` on a node in state `s`.
  double FragAfter(State s, const PodRequest& pod, const Plan& plan, const Node& node) const {
    s.cpu -= pod.cpu_milli;
    // Map node GPU index -> position in the healthy-only array.
    for (const Take& t : plan) {
      int pos = 0;
      for (int g = 0; g < t.gpu; ++g) pos += node.gpus[g].healthy;
      if (pos < s.n) s.free[pos] -= t.milli;
    }
    return Frag(s);
  }

 private:
  struct Class {
    double p = 0;
    int64_t cpu = 0;
    int32_t milli = 0;
    int32_t num = 0;
    uint64_t models = 0;
  };
  struct Group {
    int64_t cpu = 0;
    uint64_t models = 0;
    double weight = 0;             // every class of the group
    double no_gpu_weight = 0;      // classes asking no GPU (they never fit a GPU measure)
    std::vector<double> share_le;  // [x] = weight of share classes with milli <= x, x 0..1000
    std::vector<Class> multi;      // whole-GPU and multi-container classes
  };

  static bool InRange(const State& s) {
    for (int i = 0; i < s.n; ++i) {
      if (s.free[i] < 0 || s.free[i] > kMilliPerGpu) return false;
    }
    return true;
  }

  void BuildGroups() {
    groups_.clear();
    std::map<std::pair<int64_t, uint64_t>, size_t> index;
    for (const Class& c : classes_) {
      auto [it, inserted] = index.try_emplace({c.cpu, c.models}, groups_.size());
      if (inserted) {
        groups_.push_back({.cpu = c.cpu, .models = c.models});
        groups_.back().share_le.assign(kMilliPerGpu + 1, 0.0);
      }
      Group& g = groups_[it->second];
      g.weight += c.p;
      if (c.num == 0) {
        g.no_gpu_weight += c.p;
      } else if (c.num == 1 && c.milli < kMilliPerGpu) {
        for (int x = c.milli; x <= kMilliPerGpu; ++x) g.share_le[x] += c.p;
      } else {
        g.multi.push_back(c);
      }
    }
    // Grouping pays when groups are few next to classes (the extender's share-only workloads);
    // a trace whose classes nearly all differ in CPU keeps the class-by-class sum.
    use_groups_ = groups_.size() * 4 <= classes_.size();
  }

  std::vector<Class> classes_;
  std::vector<Group> groups_;
  bool use_groups_ = false;
  absl::flat_hash_map<std::string, int> model_bit_;
};

// FGD (Fragmentation Gradient Descent) and gpulet's policy, which builds on it.
//
// FGD ("fgd"): the placement whose fragmentation increase is smallest, scored like the paper's
// plugin: trunc(sigmoid((F_before - F_after) / 1000) * 100). Equal scores are left to the caller
// (Schedule(): first node in order, which is what reproduces the paper's figures).
//
// gpulet ("gpulet"): FGD's measure and score levels, plus terms that depend on whether the
// cluster has CPU and memory to spare. While it has (below), two terms for GPU tasks (CPU-only
// tasks are scored exactly like FGD):
//  - Stranding across resources: FGD's measure gates each class by the node's CPU but never
//    asks whether the CPU (or memory, which it ignores) left is enough for ALL the free GPUs.
//    gpulet takes the workload's average CPU and memory per milli-GPU and counts a node's free
//    GPU compute beyond what its free CPU and memory can serve at that ratio as stranded; a
//    placement loses 2 score levels per whole GPU it newly strands (it gains when it un-strands
//    one, by taking the GPUs a CPU-starved node could not serve anyway).
//  - Among otherwise equal scores, a node already in use (some CPU or GPU given out) before an
//    idle one (+0.5); within each group node order still decides. Idle nodes stay whole for the
//    tasks that need a whole node's GPUs or CPU.
//  - Only with resources to spare: when the cluster's free CPU or memory per free GPU (over the
//    nodes with GPU compute free) falls below 1.5 x the GPU tasks' average plus 0.2 x what the
//    expected CPU-only tasks take per GPU, CPU or memory, not GPUs, is what runs out (or soon
//    will); every node then looks stranded at the workload's ratio, that penalty spreads tasks
//    instead of packing them, and gpulet lost up to 1.2 points to FGD on such mixes. Score()
//    (no cluster given) always applies both terms.
// When CPU or memory is short (session 8), the GPUs that will stay free anyway are not the
// question; what is, is that every core and GiB left sits beside GPUs it can serve. Stranding is
// then measured against the cluster's own supply ratio (its free CPU and memory per free GPU,
// over the nodes with GPU compute free) instead of the workload's, so a node poorer than the
// cluster average in CPU or memory per free GPU counts its excess GPUs as stranded:
//  - GPU tasks of at most one GPU: 20 levels per whole GPU newly stranded, and as much gained
//    per GPU un-stranded. A task whose CPU (memory) per GPU is below the supply ratio thus goes
//    to the node poorest in CPU (memory) per free GPU, taking GPUs that node could not have
//    served, and leaves the richer nodes' CPU for the tasks that ask more. At that weight a
//    fraction of a GPU outweighs most of FGD's level differences; FGD decides among nodes that
//    strand alike. Multi-GPU tasks keep FGD's score: with the term they lost up to 1.1 points on
//    a mix with 15% of them (they need whole nodes, which FGD's measure keeps for them).
//  - CPU-only tasks: 0.5 levels per whole GPU whose memory they take (memory only: FGD's measure
//    ignores memory, while its classes are gated by node CPU, so it already keeps CPU-only tasks
//    off CPU that GPU tasks need). They go to nodes whose memory is beyond what their free GPUs
//    need (a node with every GPU given out needs none).
// An earlier rule steering CPU-only tasks to the nodes with the fewest free GPUs was dropped: on
// CPU-heavy mixes it lost 0.3-0.4 points to FGD (it drains the CPU of nodes with a few GPUs
// left, stranding them); docs/placement.md has the measurements.
//
// "fgd-exact" (the unquantised fragmentation change) is an ablation: it allocates less than FGD
// on openb, because the 100 levels plus first-in-order ties pack tasks onto fewer nodes.
class FragPolicy final : public PolicyImpl {
 public:
  struct Options {
    bool exact = false;
    bool prefer_used_nodes = false;  // gpulet: GPU tasks to nodes in use on equal levels
    bool avoid_stranding = false;    // gpulet: penalty for GPUs stranded behind CPU/memory
  };
  FragPolicy(std::string name, Options o) : name_(std::move(name)), o_(o) {}
  std::string_view name() const override { return name_; }
  void SetWorkload(const Workload& w) override {
    frag_.Set(w);
    // The workload's average CPU and memory per milli-GPU over its GPU classes, weighted by
    // frequency: what a node must keep per free GPU for the expected GPU tasks to use it. And
    // what the expected CPU-only tasks take on top, per milli-GPU the GPU tasks ask: their CPU
    // and memory come out of the same nodes, so a mix with many of them runs out of CPU sooner.
    double cpu = 0, mem = 0, gpu = 0, other_cpu = 0, other_mem = 0;
    for (const WorkloadClass& c : w.classes) {
      const double g = static_cast<double>(c.shape.TotalGpuMilli());
      const double c_cpu = c.weight * static_cast<double>(c.shape.cpu_milli);
      const double c_mem = c.weight * static_cast<double>(c.shape.memory_mib);
      if (g > 0) {
        cpu += c_cpu;
        mem += c_mem;
        gpu += c.weight * g;
      } else {
        other_cpu += c_cpu;
        other_mem += c_mem;
      }
    }
    cpu_per_milli_ = gpu > 0 ? cpu / gpu : 0;
    mem_per_milli_ = gpu > 0 ? mem / gpu : 0;
    cpu_only_cpu_per_milli_ = gpu > 0 ? other_cpu / gpu : 0;
    cpu_only_mem_per_milli_ = gpu > 0 ? other_mem / gpu : 0;
  }

 private:
  // Free GPU compute (milli) that the node's free CPU and memory cannot serve at `cpu_ratio`
  // and `mem_ratio` (per milli-GPU; 0: that resource not counted): stranded across resources.
  static double Stranded(double gpu, double cpu, double mem, double cpu_ratio, double mem_ratio) {
    double usable = gpu;
    if (cpu_ratio > 0) usable = std::min(usable, std::max(0.0, cpu) / cpu_ratio);
    if (mem_ratio > 0) usable = std::min(usable, std::max(0.0, mem) / mem_ratio);
    return gpu - usable;
  }
  // How much placing `pod` on `node` changes what is stranded at those ratios.
  static double StrandedMore(const Node& node, const PodRequest& pod, double cpu_ratio,
                             double mem_ratio) {
    const double g0 = static_cast<double>(NodeGpuFree(node));
    const double g1 = g0 - static_cast<double>(pod.TotalGpuMilli());
    return Stranded(g1, static_cast<double>(node.cpu_milli_free - pod.cpu_milli),
                    static_cast<double>(node.memory_mib_free - pod.memory_mib), cpu_ratio,
                    mem_ratio) -
           Stranded(g0, static_cast<double>(node.cpu_milli_free),
                    static_cast<double>(node.memory_mib_free), cpu_ratio, mem_ratio);
  }

  // Whether CPU or memory is short cluster-wide: the free CPU (memory) per free milli-GPU,
  // over the nodes with GPU compute free, below kPlenty x the GPU tasks' average plus
  // kCpuOnlyMargin x what the expected CPU-only tasks take per milli-GPU. Unknown (null, or no
  // GPU free) counts as not scarce.
  bool Scarce(const ClusterFree* cluster) const {
    if (cluster == nullptr || cluster->gpu_milli <= 0) return false;
    const double cpu = kPlenty * cpu_per_milli_ + kCpuOnlyMargin * cpu_only_cpu_per_milli_;
    const double mem = kPlenty * mem_per_milli_ + kCpuOnlyMargin * cpu_only_mem_per_milli_;
    return cluster->cpu_milli < cpu * cluster->gpu_milli ||
           cluster->memory_mib < mem * cluster->gpu_milli;
  }

 protected:
  bool TriesEveryGpu() const override { return true; }
  double Evaluate(const Node& node, const PodRequest& pod, const Plan& plan,
                  Context& ctx) const override {
    double score;
    if (frag_.empty()) {
      // No workload given (SetWorkload not called or empty): fragmentation is undefined, so
      // fall back to best fit rather than scoring every node alike.
      score = BestFitScore(node, pod);
    } else {
      if (!ctx.has_state) {
        ctx.state = frag_.StateOf(node);
        ctx.has_state = true;
      }
      const FragModel::State& s = ctx.state;
      if (!ctx.has_before) {
        ctx.before = frag_.Frag(s);
        ctx.has_before = true;
      }
      const double delta = frag_.Decrease(s, ctx.before, pod, plan, node);
      if (o_.exact) return delta;
      score = std::trunc(100.0 / (1.0 + std::exp(-delta / 1000.0)));
    }
    if (!o_.prefer_used_nodes && !o_.avoid_stranding) return score;
    // Both terms depend on the node and the pod only, not on the in-node plan: computed once
    // per (node, pod), not once per candidate GPU (the extender tries every GPU of every node).
    if (!ctx.has_extra) {
      ctx.has_extra = true;
      ctx.scarce = Scarce(ctx.cluster);
      if (ctx.scarce && o_.avoid_stranding && pod.TotalGpuMilli() <= kMilliPerGpu) {
        // Scarce() is true only with a cluster that has GPU compute free.
        const ClusterFree& c = *ctx.cluster;
        const double mem_ratio = c.memory_mib / c.gpu_milli;
        const double cpu_ratio = pod.TotalGpuMilli() > 0 ? c.cpu_milli / c.gpu_milli : 0;
        ctx.stranded_more = StrandedMore(node, pod, cpu_ratio, mem_ratio);
      }
      if (pod.TotalGpuMilli() > 0 && !ctx.scarce) {
        if (o_.prefer_used_nodes) {
          ctx.used = node.cpu_milli_free < node.cpu_milli_total;
          for (const Gpu& g : node.gpus) ctx.used |= g.free_milli < kMilliPerGpu;
        }
        if (o_.avoid_stranding) {
          ctx.stranded_more = StrandedMore(node, pod, cpu_per_milli_, mem_per_milli_);
        }
      }
    }
    // Both gpulet terms only while the cluster has CPU and memory to spare; otherwise stranding
    // at the cluster's supply ratio (see the class comment).
    if (ctx.scarce) {
      const int64_t g = pod.TotalGpuMilli();
      if (o_.avoid_stranding && g <= kMilliPerGpu) {
        score -= (g > 0 ? kScarcePenaltyPerGpu : kScarceCpuOnlyPenaltyPerGpu) * ctx.stranded_more /
                 kMilliPerGpu;
      }
      return score;
    }
    if (pod.TotalGpuMilli() > 0) {
      if (ctx.used) score += 0.5;
      if (o_.avoid_stranding) score -= kStrandPenaltyPerGpu * ctx.stranded_more / kMilliPerGpu;
    }
    return score;
  }

 private:
  std::string name_;
  Options o_;
  FragModel frag_;
  double cpu_per_milli_ = 0, mem_per_milli_ = 0;                    // GPU tasks
  double cpu_only_cpu_per_milli_ = 0, cpu_only_mem_per_milli_ = 0;  // CPU-only tasks
  // Score levels per whole GPU newly stranded, and the margin of CPU and memory over the
  // workload's ratios below which gpulet scores like FGD. Tuned on the TRAIN variants only
  // (docs/placement.md): a margin of 1.0 / 1.2 left gpulet behind FGD on CPU- or
  // memory-scaled mixes (-0.23 / -0.25 points), 1.5 nowhere; with it, a penalty of 0.5 / 1 /
  // 2 / 3 levels gave +0.12 / +0.13 / +0.15 / +0.18 points on the default-like train-mix5 and
  // -0.04 / -0.09 / -0.05 / -0.06 on train-cpu-tasks (many CPU-only tasks; 3 was below zero).
  static constexpr double kStrandPenaltyPerGpu = 2.0;
  static constexpr double kPlenty = 1.5;
  // The CPU-only tasks' share of the margin (session 5, TRAIN only): without it gpulet kept its
  // terms on mixes with 38-55% CPU-only tasks, whose CPU runs out part-way through, and was
  // behind FGD there (-0.05 / -0.08 points on train-cpu-tasks / train-cpu-most); 0.1, 0.2 and
  // 0.3 all close the gate on those from the start and keep the default trace's lead (+0.37 on
  // 6 seeds); 0.5 / 1.0 cost it 0.05 / 0.14 points.
  static constexpr double kCpuOnlyMargin = 0.2;
  // Levels per whole GPU stranded at the cluster's supply ratio while CPU or memory is short
  // (session 8, TRAIN only; docs/placement.md). GPU tasks of at most one GPU, 6 seeds: 20 / 30 /
  // 50 gave +2.9 / +3.8 / +4.3 points on train-cpu-tasks, but at 50 train-mix4 (15% multi-GPU
  // tasks, CPU and memory scaled) fell behind FGD (-0.07; 0 at 20 and 30); with multi-GPU tasks
  // scored too, 50 / 200 lost 1.1 / 1.5 there and 200 lost 4.5 on train-multi-cpu. 20 keeps a
  // margin below the loss. CPU-only tasks (4-seed screening): 0.25 / 0.5 / 1 alike, 2 cost 0.8
  // points on train-cpu-most.
  static constexpr double kScarcePenaltyPerGpu = 20.0;
  static constexpr double kScarceCpuOnlyPenaltyPerGpu = 0.5;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name,
                                                   const PolicyOptions& options) {
  if (name == "random") return std::make_unique<RandomPolicy>(options.seed);
  if (name == "best-fit") return std::make_unique<BestFitPolicy>();
  if (name == "dot-product") return std::make_unique<DotProductPolicy>();
  if (name == "gpu-packing") return std::make_unique<GpuPackingPolicy>();
  if (name == "fgd") return std::make_unique<FragPolicy>("fgd", FragPolicy::Options{});
  if (name == "fgd-exact") {
    return std::make_unique<FragPolicy>("fgd-exact", FragPolicy::Options{.exact = true});
  }
  if (name == "gpulet") {
    return std::make_unique<FragPolicy>(
        "gpulet", FragPolicy::Options{.prefer_used_nodes = true, .avoid_stranding = true});
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown placement policy \"", std::string(name),
                                                 "\" (known: ", absl::StrJoin(PolicyNames(), ", "),
                                                 ")"));
}

std::vector<std::string> PolicyNames() {
  return {"random", "best-fit", "gpu-packing", "dot-product", "fgd", "gpulet"};
}

}  // namespace gpulet::placement
