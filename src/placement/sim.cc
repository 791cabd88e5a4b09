// openb CSV loading and the arrival-replay simulator (see sim.h).
#include "placement/sim.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "placement/internal.h"

namespace gpulet::placement {
namespace {

// Debian builds absl with its own string_view type; the parser uses it throughout.
using SV = absl::string_view;
inline SV ToSV(std::string_view v) { return SV(v.data(), v.size()); }

// A header-addressed view over simple CSV rows (no quoting: the openb files have none, and a
// quote is reported rather than misread).
class Csv {
 public:
  Csv(SV text, SV source) : source_(source) {
    lines_ = absl::StrSplit(text, '\n');
    if (!lines_.empty() && lines_.back().empty()) lines_.pop_back();
  }

  absl::Status ReadHeader(std::span<const SV> required) {
    if (lines_.empty()) return Error(1, "empty file (expected a header line)");
    std::vector<SV> cols = Split(lines_[0]);
    for (size_t i = 0; i < cols.size(); ++i) index_[cols[i]] = static_cast<int>(i);
    ncols_ = cols.size();
    for (SV r : required) {
      if (!index_.contains(r))
        return Error(1, absl::StrCat("missing column \"", r, "\" in header"));
    }
    if (lines_.size() < 2) return Error(1, "no data rows after the header");
    return absl::OkStatus();
  }
  bool Has(SV col) const { return index_.contains(col); }
  size_t rows() const { return lines_.size() - 1; }
  int line(size_t row) const { return static_cast<int>(row) + 2; }

  // Splits data row `row`; checks the field count and quotes.
  absl::StatusOr<std::vector<SV>> Row(size_t row) const {
    SV l = lines_[row + 1];
    if (absl::StripAsciiWhitespace(l).empty()) return Error(line(row), "empty line");
    if (l.find('"') != SV::npos) {
      return Error(line(row), "quoted fields are not supported");
    }
    std::vector<SV> f = Split(l);
    if (f.size() != ncols_) {
      return Error(line(row), absl::StrCat(f.size(), " fields, header has ", ncols_));
    }
    return f;
  }
  SV Field(const std::vector<SV>& f, SV col) const { return f[index_.at(col)]; }
  absl::StatusOr<int64_t> Int(const std::vector<SV>& f, size_t row, SV col, int64_t lo,
                              int64_t hi) const {
    SV s = Field(f, col);
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) {
      return Error(line(row), absl::StrCat(col, " \"", s, "\" is not an integer"));
    }
    if (v < lo || v > hi) {
      return Error(line(row), absl::StrCat(col, " ", v, " out of range [", lo, ", ", hi, "]"));
    }
    return v;
  }
  absl::Status Error(int line, SV what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", what));
  }

 private:
  static std::vector<SV> Split(SV l) {
    l = absl::StripSuffix(l, "\r");
    std::vector<SV> f = absl::StrSplit(l, ',');
    for (auto& x : f) x = absl::StripAsciiWhitespace(x);
    return f;
  }
  std::string source_;
  std::vector<SV> lines_;
  absl::flat_hash_map<SV, int> index_;
  size_t ncols_ = 0;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return ss.str();
}

constexpr int64_t kMaxCount = 1'000'000'000'000;  // sanity bound for CPU/memory figures

}  // namespace

absl::StatusOr<Cluster> ParseOpenbNodes(std::string_view text, std::string_view source) {
  Csv csv(ToSV(text), ToSV(source));
  const SV required[] = {"sn", "cpu_milli", "memory_mib", "gpu", "model"};
  if (auto s = csv.ReadHeader(required); !s.ok()) return s;
  Cluster cluster;
  cluster.nodes.reserve(csv.rows());
  absl::flat_hash_set<std::string> names;
  for (size_t r = 0; r < csv.rows(); ++r) {
    auto f = csv.Row(r);
    if (!f.ok()) return f.status();
    Node node;
    node.name = std::string(csv.Field(*f, "sn"));
    if (node.name.empty()) return csv.Error(csv.line(r), "empty sn");
    if (!names.insert(node.name).second) {
      return csv.Error(csv.line(r), absl::StrCat("duplicate node \"", node.name, "\""));
    }
    auto cpu = csv.Int(*f, r, "cpu_milli", 0, kMaxCount);
    if (!cpu.ok()) return cpu.status();
    auto mem = csv.Int(*f, r, "memory_mib", 0, kMaxCount);
    if (!mem.ok()) return mem.status();
    auto gpus = csv.Int(*f, r, "gpu", 0, 64);
    if (!gpus.ok()) return gpus.status();
    std::string model(csv.Field(*f, "model"));
    if (*gpus > 0 && model.empty()) return csv.Error(csv.line(r), "node with GPUs has no model");
    node.cpu_milli_total = node.cpu_milli_free = *cpu;
    node.memory_mib_total = node.memory_mib_free = *mem;
    node.gpus.assign(*gpus, Gpu{model});
    cluster.nodes.push_back(std::move(node));
  }
  return cluster;
}

absl::StatusOr<std::vector<PodRequest>> ParseOpenbPods(std::string_view text,
                                                       std::string_view source) {
  Csv csv(ToSV(text), ToSV(source));
  const SV required[] = {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"};
  if (auto s = csv.ReadHeader(required); !s.ok()) return s;
  const bool has_spec = csv.Has("gpu_spec");
  std::vector<PodRequest> pods;
  pods.reserve(csv.rows());
  for (size_t r = 0; r < csv.rows(); ++r) {
    auto f = csv.Row(r);
    if (!f.ok()) return f.status();
    PodRequest p;
    p.name = std::string(csv.Field(*f, "name"));
    if (p.name.empty()) return csv.Error(csv.line(r), "empty name");
    auto cpu = csv.Int(*f, r, "cpu_milli", 0, kMaxCount);
    if (!cpu.ok()) return cpu.status();
    auto mem = csv.Int(*f, r, "memory_mib", 0, kMaxCount);
    if (!mem.ok()) return mem.status();
    auto num = csv.Int(*f, r, "num_gpu", 0, 64);
    if (!num.ok()) return num.status();
    auto milli = csv.Int(*f, r, "gpu_milli", 0, kMilliPerGpu);
    if (!milli.ok()) return milli.status();
    if (*num == 0 && *milli != 0) {
      return csv.Error(csv.line(r), absl::StrCat("gpu_milli ", *milli, " with num_gpu 0"));
    }
    if (*num > 0 && *milli == 0) return csv.Error(csv.line(r), "num_gpu > 0 with gpu_milli 0");
    if (*num > 1 && *milli != kMilliPerGpu) {
      return csv.Error(csv.line(r), absl::StrCat("multi-GPU task (num_gpu ", *num,
                                                 ") must ask whole GPUs, gpu_milli is ", *milli));
    }
    p.cpu_milli = *cpu;
    p.memory_mib = *mem;
    ContainerRequest c;
    if (*num == 1 && *milli < kMilliPerGpu) {
      c.milli = static_cast<int32_t>(*milli);
    } else {
      c.whole_gpus = static_cast<int32_t>(*num);
    }
    p.containers.push_back(c);
    if (has_spec) {
      std::set<std::string> models;
      for (SV m : absl::StrSplit(csv.Field(*f, "gpu_spec"), '|', absl::SkipEmpty())) {
        models.emplace(m.data(), m.size());
      }
      p.gpu_models.assign(models.begin(), models.end());
    }
    pods.push_back(std::move(p));
  }
  return pods;
}

absl::StatusOr<Cluster> LoadOpenbNodes(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseOpenbNodes(*text, path);
}

absl::StatusOr<std::vector<PodRequest>> LoadOpenbPods(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseOpenbPods(*text, path);
}

int64_t GpuCapacityMilli(const Cluster& cluster) {
  int64_t total = 0;
  for (const Node& n : cluster.nodes) {
    for (const Gpu& g : n.gpus) total += g.healthy ? kMilliPerGpu : 0;
  }
  return total;
}

std::vector<PodRequest> ArrivalStream(std::span<const PodRequest> trace, int64_t capacity_milli,
                                      double arrivals, uint64_t seed) {
  uint64_t rng = seed;
  std::vector<PodRequest> out(trace.begin(), trace.end());
  for (size_t i = out.size(); i > 1; --i) {  // Fisher-Yates
    std::swap(out[i - 1], out[internal::Uniform(rng, i)]);
  }
  const double target = arrivals * static_cast<double>(capacity_milli);
  double total = 0;
  for (const auto& p : out) total += static_cast<double>(p.TotalGpuMilli());
  if (trace.empty()) return out;
  if (total < target) {
    for (int64_t i = 0;; ++i) {
      const PodRequest& p = trace[internal::Uniform(rng, trace.size())];
      const double req = static_cast<double>(p.TotalGpuMilli());
      if (total + req > target) break;
      // A task that asks no GPU never moves the total: stop if only those keep coming.
      if (req == 0 && i > static_cast<int64_t>(trace.size()) * 100) break;
      total += req;
      out.push_back(p);
      out.back().name = absl::StrCat(p.name, "-tuned-", i);
    }
  } else {
    while (total > target && !out.empty()) {
      const size_t k = internal::Uniform(rng, out.size());
      total -= static_cast<double>(out[k].TotalGpuMilli());
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return out;
}

void SortForOfflinePacking(std::vector<PodRequest>& stream) {
  // Hardest to place first: more whole GPUs, then larger shares, model-constrained before free
  // ones of the same size; CPU-only tasks last (they change no GPU, so placed last they never
  // take the CPU a GPU task needed). Stable, so equal tasks keep their arrival order.
  auto key = [](const PodRequest& p) {
    int64_t whole = 0, share = 0;
    for (const auto& c : p.containers) {
      whole += c.whole_gpus;
      share = std::max<int64_t>(share, c.whole_gpus > 0 ? 0 : c.milli);
    }
    return std::make_tuple(whole, share, p.gpu_models.empty() ? 0 : 1, p.cpu_milli);
  };
  std::stable_sort(stream.begin(), stream.end(),
                   [&](const PodRequest& a, const PodRequest& b) { return key(a) > key(b); });
}

SimResult Simulate(const Cluster& cluster_in, std::span<const PodRequest> trace,
                   const Policy& policy, const SimOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SimResult res;
  res.policy = std::string(policy.name());
  res.seed = options.seed;
  Cluster cluster = cluster_in;
  uint64_t node_rng = options.seed ^ 0x6e6f6465ull;
  for (size_t i = cluster.nodes.size(); i > 1; --i) {
    std::swap(cluster.nodes[i - 1], cluster.nodes[internal::Uniform(node_rng, i)]);
  }
  const int64_t capacity = GpuCapacityMilli(cluster);
  std::vector<PodRequest> stream = ArrivalStream(trace, capacity, options.arrivals, options.seed);
  if (options.offline) SortForOfflinePacking(stream);
  uint64_t tie_rng = options.seed ^ 0x7469652d627265ull;  // a stream apart from the arrivals'
  const double cap = capacity > 0 ? static_cast<double>(capacity) : 1.0;
  int64_t arrived = 0, placed = 0;
  double next_point = 0;
  res.curve.push_back({0, 0});
  for (const PodRequest& pod : stream) {
    const int64_t req = pod.TotalGpuMilli();
    arrived += req;
    ++res.tasks;
    auto choice = Schedule(cluster, pod, policy, options.random_ties ? &tie_rng : nullptr);
    if (choice.ok() && Apply(cluster.nodes[choice->node], pod, choice->placement.assignment).ok()) {
      placed += req;
    } else {
      ++res.failed;
      res.failed_gpu_milli += req;
    }
    if (static_cast<double>(arrived) / cap >= next_point + options.curve_step) {
      next_point = static_cast<double>(arrived) / cap;
      res.curve.push_back({next_point, static_cast<double>(placed) / cap});
    }
  }
  res.arrived = static_cast<double>(arrived) / cap;
  res.allocated = static_cast<double>(placed) / cap;
  if (res.curve.back().arrived != res.arrived) res.curve.push_back({res.arrived, res.allocated});
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace gpulet::placement
