// The kubelet emulator: Registration + device manager + PodResources. See emulator.h.
#include "testing/kubelet/emulator.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/status.h"
#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"
#include "k8s/podresources/v1/api.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace gpulet::emu {
namespace {

namespace stdfs = std::filesystem;
constexpr char kCheckpointName[] = "kubelet_internal_checkpoint";
constexpr char kSupportedVersion[] = "v1beta1";
constexpr auto kDialTimeout = std::chrono::seconds(10);
constexpr auto kPreStartTimeout =
    std::chrono::seconds(30);  // KubeletPreStartContainerRPCTimeoutInSecs

// grpc-go's spelling of a status, which is what the kubelet puts into its messages.
std::string GoRpcError(const grpc::Status& s) {
  static const char* const kNames[] = {
      "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
      "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
      "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
      "DataLoss", "Unauthenticated"};
  int c = s.error_code();
  std::string name = c >= 0 && c <= 16 ? kNames[c] : absl::StrCat("Code(", c, ")");
  return absl::StrCat("rpc error: code = ", name, " desc = ", s.error_message());
}

// Merges one resource's response into the container's, as the kubelet does before handing the
// result to the runtime.
void Merge(const v1beta1::ContainerAllocateResponse& from, v1beta1::ContainerAllocateResponse* to) {
  for (const auto& [k, v] : from.envs()) (*to->mutable_envs())[k] = v;
  for (const auto& [k, v] : from.annotations()) (*to->mutable_annotations())[k] = v;
  for (const auto& m : from.mounts()) *to->add_mounts() = m;
  for (const auto& d : from.devices()) *to->add_devices() = d;
  for (const auto& c : from.cdi_devices()) *to->add_cdi_devices() = c;
}

}  // namespace

const char* PodPhaseName(PodPhase phase) {
  switch (phase) {
    case PodPhase::kPending:
      return "Pending";
    case PodPhase::kRunning:
      return "Running";
    case PodPhase::kSucceeded:
      return "Succeeded";
    case PodPhase::kFailed:
      return "Failed";
  }
  return "Unknown";
}

// One registered plugin: its channel and the thread that consumes ListAndWatch.
struct PluginConn {
  std::string resource;
  std::string socket;
  v1beta1::DevicePluginOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  grpc::ClientContext stream_ctx;
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  std::thread thread;
};

// Device-manager state of one resource.
struct ResourceRec {
  ResourceState state;
  std::shared_ptr<PluginConn> conn;  // the current plugin; null before registration/after restart
};

// Allocation restored from the checkpoint: pod uid -> container -> resource -> (ids, response).
struct RestoredEntry {
  std::vector<std::string> ids;
  v1beta1::ContainerAllocateResponse response;
};

struct KubeletEmulator::Impl : public v1beta1::Registration::Service,
                               public v1::PodResourcesLister::Service {
  EmulatorOptions opt;
  Clock* clock;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, ResourceRec> resources;
  std::vector<PodStatus> pods;
  std::map<std::string, std::map<std::string, std::map<std::string, RestoredEntry>>> restored;
  std::vector<Event> events;
  std::vector<std::shared_ptr<PluginConn>> conns;
  int64_t registrations = 0;
  bool running = false;
  bool checkpoint_loaded = false;
  bool dirty = false;  // something freed or appeared: retry pending pods
  bool worker_stop = false;
  int busy = 0;  // retries taken from `dirty` and not finished yet
  std::unique_ptr<grpc::Server> server;
  std::thread worker;
  std::mutex admit_mu;  // one admission at a time, like the kubelet's pod workers for admission

  explicit Impl(EmulatorOptions o) : opt(std::move(o)), clock(opt.clock ? opt.clock : RealClock()) {
    if (opt.pod_resources_socket.empty())
      opt.pod_resources_socket =
          (stdfs::path(opt.device_plugin_dir).parent_path() / "pod-resources" / "kubelet.sock")
              .string();
    worker = std::thread([this] { WorkerLoop(); });
  }

  std::string KubeletSocket() const {
    return (stdfs::path(opt.device_plugin_dir) / "kubelet.sock").string();
  }
  std::string CheckpointPath() const {
    return (stdfs::path(opt.device_plugin_dir) / kCheckpointName).string();
  }

  void AddEvent(const std::string& object, const std::string& type, const std::string& reason,
                const std::string& message) {  // mu held
    events.push_back(Event{clock->Now(), object, type, reason, message});
  }

  // Devices of `resource` held by live pods or by checkpoint entries not yet claimed by a pod.
  std::set<std::string> InUse(const std::string& resource) const {  // mu held
    std::set<std::string> out;
    for (const auto& p : pods) {
      if (p.phase != PodPhase::kRunning) continue;
      for (const auto& c : p.containers)
        if (auto it = c.devices.find(resource); it != c.devices.end())
          out.insert(it->second.begin(), it->second.end());
    }
    for (const auto& [uid, ctrs] : restored)
      for (const auto& [c, res] : ctrs)
        if (auto it = res.find(resource); it != res.end())
          out.insert(it->second.ids.begin(), it->second.ids.end());
    return out;
  }

  void Recount(ResourceRec& r) {  // mu held
    r.state.capacity = static_cast<int64_t>(r.state.devices.size());
    r.state.allocatable = 0;
    if (r.state.connected)
      for (const auto& d : r.state.devices) r.state.allocatable += d.healthy;
    r.state.allocated = static_cast<int64_t>(InUse(r.state.name).size());
  }
  void RecountAll() {
    for (auto& [n, r] : resources) Recount(r);
  }

  // ---- Registration service ----
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                        v1beta1::Empty*) override {
    // The kubelet's checks and messages (devicemanager plugin/v1beta1 server.go).
    if (req->version() != kSupportedVersion)
      return RegisterFailed(req, absl::StrCat("requested API version \"", req->version(),
                                              "\" is not supported by kubelet. Supported version "
                                              "is [\"",
                                              kSupportedVersion, "\"]"));
    if (!IsExtendedResourceName(req->resource_name()))
      return RegisterFailed(
          req, absl::StrCat("the ResourceName \"", req->resource_name(), "\" is invalid"));
    if (req->endpoint().empty() || req->endpoint().find('/') != std::string::npos)
      return RegisterFailed(
          req, absl::StrCat("invalid endpoint \"", req->endpoint(), "\": must be a socket name in ",
                            opt.device_plugin_dir));
    auto conn = std::make_shared<PluginConn>();
    conn->resource = req->resource_name();
    conn->socket = (stdfs::path(opt.device_plugin_dir) / req->endpoint()).string();
    // As the kubelet (plugin/v1beta1 connectClient, ManagerImpl.PluginConnected): before it
    // answers Register it dials the plugin (10 s) and asks GetDevicePluginOptions, and those
    // options, not the RegisterRequest's, decide GetPreferredAllocation and PreStartContainer.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    conn->channel =
        grpc::CreateCustomChannel("unix:" + conn->socket, grpc::InsecureChannelCredentials(), args);
    conn->stub = v1beta1::DevicePlugin::NewStub(conn->channel);
    if (!conn->channel->WaitForConnected(std::chrono::system_clock::now() + kDialTimeout))
      return RegisterFailed(req, "failed to dial device plugin: context deadline exceeded");
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kDialTimeout);
      grpc::Status st = conn->stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &conn->options);
      if (!st.ok())
        return RegisterFailed(req, "failed to get device plugin options: " + GoRpcError(st));
    }
    std::lock_guard<std::mutex> l(mu);
    if (!running) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is stopping");
    ++registrations;
    ResourceRec& r = resources[conn->resource];
    r.state.name = conn->resource;
    if (r.conn) StopConn(*r.conn);  // a new registration replaces the old plugin
    r.conn = conn;
    r.state.endpoint = req->endpoint();
    r.state.pre_start_required = conn->options.pre_start_required();
    r.state.preferred_allocation = conn->options.get_preferred_allocation_available();
    AddEvent("resource/" + conn->resource, "Normal", "Registered",
             absl::StrCat("plugin endpoint ", req->endpoint()));
    conns.push_back(conn);
    conn->thread = std::thread([this, conn] { RunConn(conn); });
    cv.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status RegisterFailed(const v1beta1::RegisterRequest* req, const std::string& msg) {
    std::lock_guard<std::mutex> l(mu);
    AddEvent("resource/" + req->resource_name(), "Warning", "RegistrationFailed", msg);
    return grpc::Status(grpc::StatusCode::UNKNOWN, msg);
  }

  static void StopConn(PluginConn& c) {
    c.stop = true;
    c.stream_ctx.TryCancel();
  }

  // Dials the plugin, then consumes ListAndWatch until the stream ends.
  // The channel Register connected: ListAndWatch until the stream ends.
  void RunConn(std::shared_ptr<PluginConn> conn) {
    auto deadline = std::chrono::steady_clock::now() + kDialTimeout;
    bool connected = false;
    while (!conn->stop && std::chrono::steady_clock::now() < deadline) {
      if (conn->channel->WaitForConnected(std::chrono::system_clock::now() +
                                          std::chrono::milliseconds(100))) {
        connected = true;
        break;
      }
    }
    if (connected && !conn->stop) {
      auto reader = conn->stub->ListAndWatch(&conn->stream_ctx, v1beta1::Empty());
      v1beta1::ListAndWatchResponse resp;
      while (reader->Read(&resp)) OnDevices(*conn, resp);
      grpc::Status st = reader->Finish();
      // A clean end (OK) is the plugin closing its stream as it stops: no "rpc error" to show.
      OnGone(*conn, conn->stop ? ""
                    : st.ok()  ? "ListAndWatch ended: the plugin closed the stream"
                               : absl::StrCat("ListAndWatch ended: ", GoRpcError(st)));
    } else {
      OnGone(*conn,
             conn->stop ? "" : absl::StrCat("cannot connect to plugin socket ", conn->socket));
    }
    conn->done = true;
  }

  void OnDevices(const PluginConn& conn, const v1beta1::ListAndWatchResponse& resp) {
    std::lock_guard<std::mutex> l(mu);
    ResourceRec& r = resources[conn.resource];
    if (r.conn.get() != &conn) return;  // replaced meanwhile
    std::vector<DeviceInfo> devs;
    for (const auto& d : resp.devices()) {
      DeviceInfo info{d.id(), d.health() == "Healthy", {}};
      for (const auto& n : d.topology().nodes()) info.numa_nodes.push_back(n.id());
      devs.push_back(std::move(info));
    }
    std::sort(devs.begin(), devs.end(), [](auto& a, auto& b) { return a.id < b.id; });
    int64_t before = r.state.allocatable;
    r.state.devices = std::move(devs);
    r.state.connected = true;
    ++r.state.generation;
    r.state.updated_at = clock->Now();
    Recount(r);
    if (r.state.allocatable != before)
      AddEvent("resource/" + conn.resource, "Normal", "DevicesChanged",
               absl::StrCat("allocatable ", before, " -> ", r.state.allocatable, " (capacity ",
                            r.state.capacity, ")"));
    dirty = true;
    cv.notify_all();
  }

  void OnGone(const PluginConn& conn, const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    ResourceRec& r = resources[conn.resource];
    if (r.conn.get() != &conn) return;
    r.state.connected = false;
    Recount(r);
    if (!why.empty())
      AddEvent("resource/" + conn.resource, "Warning", "PluginGone",
               absl::StrCat(why, "; devices unhealthy, allocatable 0"));
    cv.notify_all();
  }

  // ---- PodResources service ----
  void FillDevices(
      const std::string& resource, const std::vector<std::string>& ids,
      google::protobuf::RepeatedPtrField<v1::ContainerDevices>* out) const {  // mu held
    // One entry per device and NUMA node, as the kubelet reports them.
    std::map<std::string, const DeviceInfo*> known;
    if (auto it = resources.find(resource); it != resources.end())
      for (const auto& d : it->second.state.devices) known[d.id] = &d;
    for (const auto& id : ids) {
      auto k = known.find(id);
      if (k == known.end() || k->second->numa_nodes.empty()) {
        auto* cd = out->Add();
        cd->set_resource_name(resource);
        cd->add_device_ids(id);
        continue;
      }
      for (int64_t n : k->second->numa_nodes) {
        auto* cd = out->Add();
        cd->set_resource_name(resource);
        cd->add_device_ids(id);
        cd->mutable_topology()->add_nodes()->set_id(n);
      }
    }
  }

  void FillPod(const PodStatus& p, v1::PodResources* out) const {  // mu held
    out->set_name(p.spec.name);
    out->set_namespace_(p.spec.namespace_);
    for (const auto& c : p.spec.containers) {
      auto* cr = out->add_containers();
      cr->set_name(c.name);
      for (const auto& a : p.containers)
        if (a.container == c.name)
          for (const auto& [res, ids] : a.devices) FillDevices(res, ids, cr->mutable_devices());
    }
  }

  static bool Active(const PodStatus& p) {
    return p.phase == PodPhase::kRunning || p.phase == PodPhase::kPending;
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* resp) override {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& p : pods)
      if (Active(p)) FillPod(p, resp->add_pod_resources());
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* req,
                   v1::GetPodResourcesResponse* resp) override {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& p : pods)
      if (Active(p) && p.spec.name == req->pod_name() &&
          p.spec.namespace_ == req->pod_namespace()) {
        FillPod(p, resp->mutable_pod_resources());
        return grpc::Status::OK;
      }
    // The kubelet answers with a plain Go error: gRPC code Unknown, not NotFound.
    return grpc::Status(grpc::StatusCode::UNKNOWN,
                        absl::StrCat("pod ", req->pod_name(), " in namespace ",
                                     req->pod_namespace(), " not found"));
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext*, const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* resp) override {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [name, r] : resources) {
      if (!r.state.connected) continue;
      std::vector<std::string> ids;
      for (const auto& d : r.state.devices)
        if (d.healthy) ids.push_back(d.id);
      FillDevices(name, ids, resp->mutable_devices());
    }
    return grpc::Status::OK;
  }

  // ---- checkpoint ----
  // Same shape as the kubelet's kubelet_internal_checkpoint (Data.PodDeviceEntries with
  // DeviceIDs per NUMA node and the base64 AllocResp; Data.RegisteredDevices). The Checksum is
  // written as 0: the kubelet's is a hash of Go's in-memory dump and is not reproducible here.
  void WriteCheckpoint() {  // mu held
    nlohmann::json entries = nlohmann::json::array();
    auto numa_of = [&](const std::string& res, const std::string& id) -> std::string {
      if (auto it = resources.find(res); it != resources.end())
        for (const auto& d : it->second.state.devices)
          if (d.id == id && !d.numa_nodes.empty()) return std::to_string(d.numa_nodes[0]);
      return "-1";
    };
    auto add = [&](const std::string& uid, const std::string& ctr, const std::string& res,
                   const std::vector<std::string>& ids,
                   const v1beta1::ContainerAllocateResponse& resp) {
      nlohmann::json per_numa = nlohmann::json::object();
      for (const auto& id : ids) per_numa[numa_of(res, id)].push_back(id);
      entries.push_back({{"PodUID", uid},
                         {"ContainerName", ctr},
                         {"ResourceName", res},
                         {"DeviceIDs", per_numa},
                         {"AllocResp", absl::Base64Escape(resp.SerializeAsString())}});
    };
    for (const auto& p : pods) {
      if (p.phase != PodPhase::kRunning) continue;
      for (const auto& c : p.containers)
        for (const auto& [res, ids] : c.devices) add(p.spec.uid, c.container, res, ids, c.response);
    }
    for (const auto& [uid, ctrs] : restored)
      for (const auto& [ctr, rs] : ctrs)
        for (const auto& [res, e] : rs) add(uid, ctr, res, e.ids, e.response);
    nlohmann::json registered = nlohmann::json::object();
    for (const auto& [name, r] : resources) {
      registered[name] = nlohmann::json::array();
      for (const auto& d : r.state.devices) registered[name].push_back(d.id);
    }
    nlohmann::json doc = {
        {"Data", {{"PodDeviceEntries", entries}, {"RegisteredDevices", registered}}},
        {"Checksum", 0}};
    absl::Status s = WriteFileAtomic(CheckpointPath(), doc.dump());
    if (!s.ok()) AddEvent("node", "Warning", "CheckpointFailed", std::string(s.message()));
  }

  absl::Status LoadCheckpoint() {  // mu held
    if (!stdfs::exists(CheckpointPath())) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(CheckpointPath()));
    nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat(CheckpointPath(), ": corrupt checkpoint: ", what,
                                              " (delete it to start clean)"));
    };
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("Data") || !doc["Data"].is_object())
      return bad("not a checkpoint JSON object with Data");
    try {
      const nlohmann::json entries = doc["Data"].value("PodDeviceEntries", nlohmann::json::array());
      for (const auto& e : entries) {
        RestoredEntry r;
        for (const auto& [numa, ids] : e.at("DeviceIDs").items())
          for (const auto& id : ids) r.ids.push_back(id.get<std::string>());
        std::string raw;
        if (!absl::Base64Unescape(e.at("AllocResp").get<std::string>(), &raw) ||
            !r.response.ParseFromString(raw))
          return bad("AllocResp is not a ContainerAllocateResponse");
        restored[e.at("PodUID").get<std::string>()][e.at("ContainerName").get<std::string>()]
                [e.at("ResourceName").get<std::string>()] = std::move(r);
      }
      const nlohmann::json registered =
          doc["Data"].value("RegisteredDevices", nlohmann::json::object());
      for (const auto& [name, ids] : registered.items()) {
        ResourceRec& r = resources[name];
        r.state.name = name;
        r.state.devices.clear();
        // Known from the checkpoint but not yet reported: unhealthy until the plugin is back.
        for (const auto& id : ids)
          r.state.devices.push_back(DeviceInfo{id.get<std::string>(), false, {}});
      }
    } catch (const nlohmann::json::exception& e) {
      return bad(e.what());
    }
    RecountAll();
    return absl::OkStatus();
  }

  // ---- admission ----
  struct Need {
    std::string container;
    std::string resource;
    int64_t count;
  };

  static std::vector<Need> Needs(const PodSpec& spec) {
    std::vector<Need> out;
    for (const auto& c : spec.containers)
      for (const auto& [name, qty] : c.limits)
        if (IsExtendedResourceName(name))
          if (int64_t n = ExtendedRequest(c, name); n > 0) out.push_back({c.name, name, n});
    return out;
  }

  PodStatus* FindPod(const std::string& ns, const std::string& name) {  // mu held
    for (auto& p : pods)
      if (p.spec.namespace_ == ns && p.spec.name == name) return &p;
    return nullptr;
  }

  void SetPhase(PodStatus& p, PodPhase phase, const std::string& reason, const std::string& msg,
                bool warning) {  // mu held
    bool changed = p.phase != phase || p.reason != reason || p.message != msg;
    p.phase = phase;
    p.reason = reason;
    p.message = msg;
    if (changed)
      AddEvent("pod/" + p.spec.Key(), warning ? "Warning" : "Normal",
               reason.empty() ? PodPhaseName(phase) : reason, msg);
  }

  // Runs admission for a Pending pod (admit_mu held, mu not held).
  void Admit(const std::string& ns, const std::string& name) {
    std::vector<Need> needs;
    PodSpec spec;
    bool schedule;
    {
      std::lock_guard<std::mutex> l(mu);
      PodStatus* p = FindPod(ns, name);
      if (!p || p->phase != PodPhase::kPending) return;
      spec = p->spec;
      needs = Needs(spec);
      schedule = opt.scheduler && spec.node_name.empty();
      // The scheduler's view: node allocatable minus what bound pods requested.
      std::map<std::string, int64_t> total;
      for (const auto& n : needs) total[n.resource] += n.count;
      std::vector<std::string> insufficient;
      std::string out_of_res, out_of_msg;  // first resource the node does not have at all
      for (const auto& [res, n] : total) {
        auto it = resources.find(res);
        int64_t alloc = it == resources.end() ? 0 : it->second.state.allocatable;
        int64_t used = it == resources.end() ? 0 : it->second.state.allocated;
        // Devices the checkpoint holds for this very pod are its own, not someone else's.
        if (auto ru = restored.find(spec.uid); ru != restored.end())
          for (const auto& [ctr, rs] : ru->second)
            if (auto rr = rs.find(res); rr != rs.end()) used -= rr->second.ids.size();
        int64_t cap = it == resources.end() ? 0 : it->second.state.capacity;
        if (alloc - used < n) insufficient.push_back("1 Insufficient " + res);
        if (cap == 0 && out_of_res.empty()) {
          out_of_res = res;
          out_of_msg = absl::StrCat("Pod was rejected: Node didn't have enough resource: ", res,
                                    ", requested: ", n, ", used: ", used, ", capacity: 0");
        }
      }
      if (schedule && !insufficient.empty()) {
        SetPhase(*p, PodPhase::kPending, "Unschedulable",
                 absl::StrCat("0/1 nodes are available: ", absl::StrJoin(insufficient, ", "), "."),
                 true);
        return;
      }
      if (!out_of_res.empty()) {  // the kubelet's predicate admission: resource absent from node
        SetPhase(*p, PodPhase::kFailed, "OutOf" + out_of_res, out_of_msg, true);
        return;
      }
    }
    // Device manager: allocate container by container (mu released around RPCs).
    std::vector<ContainerAllocation> allocs;
    std::set<std::string> reserved;  // "res\x1fid" of this pod, so later containers skip them
    std::string error;
    std::vector<std::pair<std::shared_ptr<PluginConn>, std::vector<std::string>>> prestart;
    for (const auto& c : spec.containers) {
      ContainerAllocation ca;
      ca.container = c.name;
      for (const auto& n : needs) {
        if (n.container != c.name || !error.empty()) continue;
        std::shared_ptr<PluginConn> conn;
        std::vector<std::string> available, reuse;
        {
          std::lock_guard<std::mutex> l(mu);
          ResourceRec& r = resources[n.resource];
          conn = r.conn;
          std::set<std::string> in_use = InUse(n.resource);
          bool any_healthy = false;
          if (r.state.connected)
            for (const auto& d : r.state.devices) {
              if (!d.healthy) continue;
              any_healthy = true;
              if (!in_use.count(d.id) && !reserved.count(n.resource + "\x1f" + d.id))
                available.push_back(d.id);
            }
          // A restarted kubelet gives a known pod the devices its checkpoint recorded.
          if (auto ru = restored.find(spec.uid); ru != restored.end())
            if (auto rc = ru->second.find(c.name); rc != ru->second.end())
              if (auto rr = rc->second.find(n.resource); rr != rc->second.end()) {
                ca.devices[n.resource] = rr->second.ids;
                Merge(rr->second.response, &ca.response);
                rc->second.erase(rr);
                for (const auto& id : ca.devices[n.resource])
                  reserved.insert(n.resource + "\x1f" + id);
                continue;
              }
          if (!any_healthy || !conn) {
            error = "no healthy devices present; cannot allocate unhealthy devices " + n.resource;
            continue;
          }
          if (static_cast<int64_t>(available.size()) < n.count) {
            error = absl::StrCat("requested number of devices unavailable for ", n.resource,
                                 ". Requested: ", n.count, ", Available: ", available.size());
            continue;
          }
        }
        std::vector<std::string> chosen;
        if (conn->options.get_preferred_allocation_available()) {
          v1beta1::PreferredAllocationRequest req;
          auto* cr = req.add_container_requests();
          for (const auto& id : available) cr->add_available_deviceids(id);
          cr->set_allocation_size(static_cast<int32_t>(n.count));
          v1beta1::PreferredAllocationResponse resp;
          grpc::ClientContext ctx;
          grpc::Status st = conn->stub->GetPreferredAllocation(&ctx, req, &resp);
          if (!st.ok()) {
            error = GoRpcError(st);
            continue;
          }
          std::set<std::string> avail(available.begin(), available.end());
          if (resp.container_responses_size() > 0)
            for (const auto& id : resp.container_responses(0).deviceids())
              if (avail.erase(id) && static_cast<int64_t>(chosen.size()) < n.count)
                chosen.push_back(id);
        }
        // The preference is a hint: fill up from the remaining free devices.
        for (const auto& id : available) {
          if (static_cast<int64_t>(chosen.size()) >= n.count) break;
          if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
        }
        v1beta1::AllocateRequest areq;
        auto* acr = areq.add_container_requests();
        for (const auto& id : chosen) acr->add_devices_ids(id);
        v1beta1::AllocateResponse aresp;
        grpc::ClientContext actx;
        grpc::Status st = conn->stub->Allocate(&actx, areq, &aresp);
        if (!st.ok()) {
          error = GoRpcError(st);
          continue;
        }
        if (aresp.container_responses_size() != 1) {
          error = absl::StrCat("plugin returned ", aresp.container_responses_size(),
                               " container responses for 1 container request");
          continue;
        }
        Merge(aresp.container_responses(0), &ca.response);
        ca.devices[n.resource] = chosen;
        for (const auto& id : chosen) reserved.insert(n.resource + "\x1f" + id);
        if (conn->options.pre_start_required()) prestart.emplace_back(conn, chosen);
      }
      allocs.push_back(std::move(ca));
    }
    if (error.empty()) {
      for (const auto& [conn, ids] : prestart) {
        v1beta1::PreStartContainerRequest req;
        for (const auto& id : ids) req.add_devices_ids(id);
        v1beta1::PreStartContainerResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + kPreStartTimeout);
        grpc::Status st = conn->stub->PreStartContainer(&ctx, req, &resp);
        if (!st.ok()) {
          std::lock_guard<std::mutex> l(mu);
          if (PodStatus* p = FindPod(ns, name))
            SetPhase(*p, PodPhase::kFailed, "CreateContainerError",
                     "PreStartContainer failed: " + GoRpcError(st), true);
          return;
        }
      }
    }
    std::lock_guard<std::mutex> l(mu);
    PodStatus* p = FindPod(ns, name);
    if (!p || p->phase != PodPhase::kPending) return;  // deleted meanwhile
    if (!error.empty()) {
      SetPhase(*p, PodPhase::kFailed, "UnexpectedAdmissionError",
               "Pod was rejected: Allocate failed due to " + error + ", which is unexpected", true);
      RecountAll();
      return;
    }
    p->containers = std::move(allocs);
    p->started_at = clock->Now();
    if (auto ru = restored.find(spec.uid); ru != restored.end()) restored.erase(ru);
    SetPhase(*p, PodPhase::kRunning, "Started",
             p->spec.run_time_ms > 0
                 ? absl::StrCat("simulated run time ",
                                absl::FormatDuration(absl::Milliseconds(p->spec.run_time_ms)))
                 : std::string("runs until deleted"),
             false);
    RecountAll();
    WriteCheckpoint();
    cv.notify_all();
  }

  void RetryPending() {
    std::lock_guard<std::mutex> a(admit_mu);
    std::vector<std::pair<std::string, std::string>> todo;
    {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& p : pods)
        if (p.phase == PodPhase::kPending) todo.emplace_back(p.spec.namespace_, p.spec.name);
    }
    for (const auto& [ns, n] : todo) Admit(ns, n);
  }

  // Completes pods whose simulated run time is over and retries pending pods when something
  // was freed or appeared.
  void WorkerLoop() {
    std::unique_lock<std::mutex> l(mu);
    while (!worker_stop) {
      bool timed = false;
      auto now = clock->Now();
      for (auto& p : pods) {
        if (p.phase != PodPhase::kRunning || p.spec.run_time_ms <= 0) continue;
        if (now - p.started_at >= std::chrono::milliseconds(p.spec.run_time_ms)) {
          SetPhase(p, PodPhase::kSucceeded, "Completed",
                   absl::StrCat("simulated run time ",
                                absl::FormatDuration(absl::Milliseconds(p.spec.run_time_ms)),
                                " over; devices freed"),
                   false);
          dirty = true;
        } else {
          timed = true;
        }
      }
      if (dirty) {
        dirty = false;
        ++busy;
        RecountAll();
        WriteCheckpoint();
        l.unlock();
        RetryPending();
        l.lock();
        --busy;
        cv.notify_all();
        continue;
      }
      // Real-time polling while a run time is pending keeps this simple with a fake clock too.
      cv.wait_for(l, timed ? std::chrono::milliseconds(20) : std::chrono::milliseconds(500));
    }
  }
};

KubeletEmulator::KubeletEmulator(EmulatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

KubeletEmulator::~KubeletEmulator() {
  Stop();
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->worker_stop = true;
    impl_->cv.notify_all();
  }
  impl_->worker.join();
}

absl::Status KubeletEmulator::Start() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> l(m.mu);
  if (m.running) return absl::OkStatus();
  std::error_code ec;
  stdfs::create_directories(m.opt.device_plugin_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create device-plugin dir ",
                                            m.opt.device_plugin_dir, ": ", ec.message()));
  // The kubelet's CleanupPluginDirectory: every non-directory entry but the checkpoint goes.
  for (const auto& e : stdfs::directory_iterator(m.opt.device_plugin_dir, ec)) {
    if (e.is_directory() || e.path().filename() == kCheckpointName) continue;
    stdfs::remove(e.path(), ec);
  }
  if (!m.checkpoint_loaded) {
    RETURN_IF_ERROR(m.LoadCheckpoint());
    m.checkpoint_loaded = true;
  }
  stdfs::create_directories(stdfs::path(m.opt.pod_resources_socket).parent_path(), ec);
  stdfs::remove(m.opt.pod_resources_socket, ec);
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + m.KubeletSocket(), grpc::InsecureServerCredentials());
  b.AddListeningPort("unix:" + m.opt.pod_resources_socket, grpc::InsecureServerCredentials());
  b.RegisterService(static_cast<v1beta1::Registration::Service*>(&m));
  b.RegisterService(static_cast<v1::PodResourcesLister::Service*>(&m));
  m.server = b.BuildAndStart();
  if (!m.server)
    return absl::UnavailableError(absl::StrCat("cannot serve ", m.KubeletSocket(), " and ",
                                               m.opt.pod_resources_socket,
                                               " (path too long, or directory not writable?)"));
  m.running = true;
  m.AddEvent("node", "Normal", "Starting",
             absl::StrCat("kubelet emulator serving ", m.KubeletSocket()));
  return absl::OkStatus();
}

void KubeletEmulator::Stop() {
  Impl& m = *impl_;
  std::vector<std::shared_ptr<PluginConn>> conns;
  std::unique_ptr<grpc::Server> server;
  {
    std::lock_guard<std::mutex> l(m.mu);
    if (!m.running) return;
    m.running = false;
    for (auto& [name, r] : m.resources) {
      r.conn.reset();  // later stream ends are not "plugin gone" events
      r.state.connected = false;
    }
    m.RecountAll();
    conns.swap(m.conns);
    server = std::move(m.server);
    m.AddEvent("node", "Normal", "Stopping", "kubelet emulator stopped; sockets removed");
    m.cv.notify_all();
  }
  for (auto& c : conns) Impl::StopConn(*c);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  for (auto& c : conns)
    if (c->thread.joinable()) c->thread.join();
  std::error_code ec;
  stdfs::remove(m.KubeletSocket(), ec);
  stdfs::remove(m.opt.pod_resources_socket, ec);
}

bool KubeletEmulator::running() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->running;
}
std::string KubeletEmulator::kubelet_socket() const { return impl_->KubeletSocket(); }
std::string KubeletEmulator::pod_resources_socket() const {
  return impl_->opt.pod_resources_socket;
}
const std::string& KubeletEmulator::device_plugin_dir() const {
  return impl_->opt.device_plugin_dir;
}

std::vector<ResourceState> KubeletEmulator::Resources() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  std::vector<ResourceState> out;
  for (const auto& [n, r] : impl_->resources) out.push_back(r.state);
  return out;
}

std::optional<ResourceState> KubeletEmulator::Resource(const std::string& name) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->resources.find(name);
  if (it == impl_->resources.end()) return std::nullopt;
  return it->second.state;
}

absl::Status KubeletEmulator::WaitForAllocatable(const std::string& name, int64_t n,
                                                 std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(impl_->mu);
  auto value = [&]() -> int64_t {
    auto it = impl_->resources.find(name);
    return it == impl_->resources.end() ? -1 : it->second.state.allocatable;
  };
  if (impl_->cv.wait_for(l, timeout, [&] { return value() == n; })) return absl::OkStatus();
  int64_t v = value();
  return absl::DeadlineExceededError(
      v < 0 ? absl::StrCat(name, ": not registered after ", timeout.count(), "ms")
            : absl::StrCat(name, ": allocatable ", v, ", want ", n, " after ", timeout.count(),
                           "ms"));
}

absl::StatusOr<ResourceState> KubeletEmulator::WaitForUpdate(const std::string& name,
                                                             uint64_t after,
                                                             std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(impl_->mu);
  auto ok = [&] {
    auto it = impl_->resources.find(name);
    return it != impl_->resources.end() && it->second.state.generation > after;
  };
  if (!impl_->cv.wait_for(l, timeout, ok))
    return absl::DeadlineExceededError(absl::StrCat(name,
                                                    ": no ListAndWatch update after generation ",
                                                    after, " within ", timeout.count(), "ms"));
  return impl_->resources[name].state;
}

int64_t KubeletEmulator::registrations() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->registrations;
}

absl::StatusOr<PodStatus> KubeletEmulator::AddPod(const PodSpec& pod) {
  Impl& m = *impl_;
  // The API server's validation, for pods built in code rather than parsed.
  if (pod.name.empty() || pod.containers.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(pod.source, ": pod needs metadata.name and spec.containers"));
  for (const auto& c : pod.containers)
    for (const auto& [name, qty] : c.requests) {
      if (!IsExtendedResourceName(name)) continue;
      auto lim = c.limits.find(name);
      if (lim == c.limits.end())
        return absl::InvalidArgumentError(
            absl::StrCat(pod.source, ": pod ", pod.Key(), " container ", c.name,
                         ": resources.limits: Required value: Limit must be set for non "
                         "overcommitable resources (",
                         name, ")"));
      if (lim->second != qty)
        return absl::InvalidArgumentError(absl::StrCat(
            pod.source, ": pod ", pod.Key(), " container ", c.name, ": resources.requests[", name,
            "]: Invalid value: \"", qty, "\": must be equal to ", name, " limit of ", lim->second));
    }
  std::lock_guard<std::mutex> a(m.admit_mu);
  {
    std::lock_guard<std::mutex> l(m.mu);
    if (m.FindPod(pod.namespace_, pod.name))
      return absl::AlreadyExistsError(
          absl::StrCat("pods \"", pod.name, "\" already exists in namespace ", pod.namespace_));
    PodStatus st;
    st.spec = pod;
    m.pods.push_back(std::move(st));
    m.AddEvent("pod/" + pod.Key(), "Normal", "Created", pod.source);
  }
  m.Admit(pod.namespace_, pod.name);
  std::lock_guard<std::mutex> l(m.mu);
  return *m.FindPod(pod.namespace_, pod.name);
}

absl::Status KubeletEmulator::DeletePod(const std::string& ns, const std::string& name) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> a(m.admit_mu);
  std::lock_guard<std::mutex> l(m.mu);
  auto it = std::find_if(m.pods.begin(), m.pods.end(), [&](const PodStatus& p) {
    return p.spec.namespace_ == ns && p.spec.name == name;
  });
  if (it == m.pods.end())
    return absl::NotFoundError(absl::StrCat("pods \"", name, "\" not found in namespace ", ns));
  m.restored.erase(it->spec.uid);
  m.AddEvent("pod/" + it->spec.Key(), "Normal", "Killing", "pod deleted; devices freed");
  m.pods.erase(it);
  m.RecountAll();
  m.WriteCheckpoint();
  m.dirty = true;
  m.cv.notify_all();
  return absl::OkStatus();
}

std::optional<PodStatus> KubeletEmulator::GetPod(const std::string& ns,
                                                 const std::string& name) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  for (const auto& p : impl_->pods)
    if (p.spec.namespace_ == ns && p.spec.name == name) return p;
  return std::nullopt;
}

std::vector<PodStatus> KubeletEmulator::Pods() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->pods;
}

absl::StatusOr<PodStatus> KubeletEmulator::WaitForPodPhase(const std::string& ns,
                                                           const std::string& name, PodPhase phase,
                                                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(impl_->mu);
  auto reached = [&] {
    PodStatus* p = impl_->FindPod(ns, name);
    return p && p->phase == phase;
  };
  if (impl_->cv.wait_for(l, timeout, reached)) return *impl_->FindPod(ns, name);
  PodStatus* p = impl_->FindPod(ns, name);
  if (!p) return absl::NotFoundError(absl::StrCat("pod ", ns, "/", name, " not found"));
  return absl::DeadlineExceededError(
      absl::StrCat("pod ", ns, "/", name, " is ", PodPhaseName(p->phase), " (", p->reason, ": ",
                   p->message, "), not ", PodPhaseName(phase), " after ", timeout.count(), "ms"));
}

bool KubeletEmulator::HasTimedPods() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  for (const auto& p : impl_->pods)
    if (p.phase == PodPhase::kRunning && p.spec.run_time_ms > 0) return true;
  return false;
}

bool KubeletEmulator::WaitIdle(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    {
      std::lock_guard<std::mutex> a(impl_->admit_mu);  // no admission running right now
      std::lock_guard<std::mutex> l(impl_->mu);
      if (!impl_->dirty && impl_->busy == 0) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::vector<Event> KubeletEmulator::Events() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->events;
}

}  // namespace gpulet::emu
