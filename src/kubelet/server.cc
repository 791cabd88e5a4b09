#include "kubelet/server.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net.h"
#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"

namespace gpulet::kubelet {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Identity of a file: inode and change time, so a file deleted and created again is a different
// file even when the filesystem reuses the inode number. 0 when absent.
uint64_t InodeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return (uint64_t{st.st_ino} * 1000003u) ^
         (uint64_t(st.st_ctim.tv_sec) * 1000000000u + st.st_ctim.tv_nsec) ^ 1;
}

}  // namespace

std::string SocketNameFor(const std::string& resource_name) {
  std::string domain, rest = resource_name;
  if (auto slash = resource_name.find('/'); slash != std::string::npos) {
    domain = resource_name.substr(0, slash);
    rest = resource_name.substr(slash + 1);
    domain = domain.substr(0, domain.find('.'));
  }
  for (char& c : rest)
    if (c == '/') c = '-';
  return (domain.empty() ? rest : domain + "-" + rest) + ".sock";
}

// One resource's DevicePlugin service on its socket. Serve/Stop are called by the manager thread
// only; the handlers run on gRPC's threads.
class PluginServer final : public v1beta1::DevicePlugin::Service {
 public:
  PluginServer(std::shared_ptr<Resource> resource, std::string socket)
      : resource_(std::move(resource)), socket_(std::move(socket)) {}
  ~PluginServer() override { Retire(); }

  // (Re)creates the socket and serves on it. Fails once Retire()d.
  absl::Status Serve() {
    absl::MutexLock l(&life_mu_);
    if (retired_) return absl::CancelledError("server retired");
    StopLocked();
    ::unlink(socket_.c_str());  // a stale socket from a previous run would make bind fail
    stopping_ = false;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (!server_) {
      // gRPC logs the reason (errno) in its own voice only; the probe says it in ours.
      absl::Status why = ProbeUnixListen(socket_);
      return absl::UnavailableError(why.ok() ? absl::StrCat("cannot serve on ", socket_)
                                             : std::string(why.message()));
    }
    inode_ = InodeOf(socket_);
    return absl::OkStatus();
  }

  // Stops serving for good (the resource set was replaced, or shutdown); removes our socket.
  void Retire() {
    absl::MutexLock l(&life_mu_);
    retired_ = true;
    StopLocked();
  }

  // True while our socket file is the one we bound (the kubelet deletes it when it restarts).
  bool SocketIntact() const {
    absl::MutexLock l(&life_mu_);
    return retired_ || (server_ && inode_ != 0 && InodeOf(socket_) == inode_);
  }

  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(life_mu_) {
    if (!server_) return;
    stopping_ = true;  // ListAndWatch streams notice within one wait slice
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    server_->Wait();
    server_.reset();
    if (inode_ != 0 && InodeOf(socket_) == inode_) ::unlink(socket_.c_str());
    inode_ = 0;
  }

  absl::Status Register(const std::string& kubelet_socket, absl::Duration timeout) {
    auto channel =
        grpc::CreateChannel("unix:" + kubelet_socket, grpc::InsecureChannelCredentials());
    auto stub = v1beta1::Registration::NewStub(channel);
    v1beta1::RegisterRequest req;
    req.set_version("v1beta1");
    req.set_endpoint(socket_.substr(socket_.rfind('/') + 1));
    req.set_resource_name(resource_->name());
    req.mutable_options()->set_get_preferred_allocation_available(true);
    req.mutable_options()->set_pre_start_required(resource_->pre_start_required());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1beta1::Empty resp;
    grpc::Status s = stub->Register(&ctx, req, &resp);
    if (!s.ok())
      return absl::UnavailableError(absl::StrCat("Register ", resource_->name(), " with ",
                                                 kubelet_socket, ": ", s.error_message()));
    return absl::OkStatus();
  }

  const std::shared_ptr<Resource>& resource() const { return resource_; }
  const std::string& socket() const { return socket_; }

  // --- DevicePlugin ---
  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_get_preferred_allocation_available(true);
    out->set_pre_start_required(resource_->pre_start_required());
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    const ChangeNotifier* changes = resource_->changes();
    uint64_t gen = changes->generation();  // read before the list so no change is missed
    std::vector<DeviceState> last = resource_->Devices();
    if (!writer->Write(ToResponse(last))) return grpc::Status::OK;
    while (!stopping_ && !ctx->IsCancelled()) {
      uint64_t now = changes->WaitChange(gen, absl::Milliseconds(100));
      if (now == gen) continue;
      gen = now;
      std::vector<DeviceState> devices = resource_->Devices();
      if (devices == last) continue;
      last = std::move(devices);
      if (!writer->Write(ToResponse(last))) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    for (const auto& c : req->container_requests()) {
      std::vector<std::string> avail(c.available_deviceids().begin(),
                                     c.available_deviceids().end());
      std::vector<std::string> must(c.must_include_deviceids().begin(),
                                    c.must_include_deviceids().end());
      auto ids = resource_->Preferred(avail, must, c.allocation_size());
      if (!ids.ok()) return ToGrpc(ids.status());
      auto* r = out->add_container_responses();
      for (auto& id : *ids) r->add_deviceids(std::move(id));
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    for (const auto& c : req->container_requests()) {
      std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      auto resp = resource_->Allocate(ids);
      if (!resp.ok()) {
        spdlog::warn("Allocate {} [{}]: {}", resource_->name(), absl::StrJoin(ids, ","),
                     std::string(resp.status().message()));
        return ToGrpc(resp.status());
      }
      *out->add_container_responses() = std::move(*resp);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override {
    std::vector<std::string> ids(req->devices_ids().begin(), req->devices_ids().end());
    return ToGrpc(resource_->PreStart(ids));
  }

 private:
  static v1beta1::ListAndWatchResponse ToResponse(const std::vector<DeviceState>& devices) {
    v1beta1::ListAndWatchResponse resp;
    for (const auto& d : devices) {
      auto* dev = resp.add_devices();
      dev->set_id(d.id);
      dev->set_health(d.healthy ? "Healthy" : "Unhealthy");
      if (d.numa_node >= 0) dev->mutable_topology()->add_nodes()->set_id(d.numa_node);
    }
    return resp;
  }

  const std::shared_ptr<Resource> resource_;
  const std::string socket_;
  mutable absl::Mutex life_mu_;  // serialises Serve/Retire between the manager thread and callers
  bool retired_ ABSL_GUARDED_BY(life_mu_) = false;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(life_mu_);
  uint64_t inode_ ABSL_GUARDED_BY(life_mu_) = 0;
  std::atomic<bool> stopping_{false};
};

struct PluginManager::Entry {
  std::unique_ptr<PluginServer> server;
  bool registered = false;
  uint64_t kubelet_inode = 0;  // identity of the kubelet.sock we registered with
  Clock::TimePoint next_attempt = Clock::TimePoint::min();  // on options.clock
  absl::Duration backoff;
  int registrations = 0;
  int serves = 0;
  std::string last_error;
};

PluginManager::PluginManager(ManagerOptions options) : options_(std::move(options)) {}

PluginManager::~PluginManager() { Stop(); }

absl::Status PluginManager::SetResources(std::vector<std::shared_ptr<Resource>> resources) {
  struct stat st;
  if (::stat(options_.plugin_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return absl::FailedPreconditionError(
        absl::StrCat("device-plugin directory ", options_.plugin_dir, " does not exist"));
  std::set<std::string> names;
  for (const auto& r : resources)
    if (!names.insert(r->name()).second)
      return absl::InvalidArgumentError(absl::StrCat("resource ", r->name(), " offered twice"));

  std::vector<std::shared_ptr<Entry>> fresh;
  for (auto& r : resources) {
    auto e = std::make_shared<Entry>();
    e->backoff = options_.initial_backoff;
    e->server = std::make_unique<PluginServer>(
        r, absl::StrCat(options_.plugin_dir, "/", SocketNameFor(r->name())));
    fresh.push_back(std::move(e));
  }
  std::vector<std::shared_ptr<Entry>> old;
  {
    absl::MutexLock l(&mu_);
    old.swap(entries_);
  }
  for (auto& e : old) e->server->Retire();  // before binding: a renamed resource may reuse a socket
  for (auto& e : fresh) {
    absl::Status s = e->server->Serve();
    if (!s.ok()) {
      for (auto& f : fresh) f->server->Retire();
      return s;
    }
    e->serves = 1;
  }
  absl::MutexLock l(&mu_);
  entries_ = std::move(fresh);
  if (!thread_.joinable() && !stopping_) {
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ >= 0 &&
        ::inotify_add_watch(inotify_fd_, options_.plugin_dir.c_str(),
                            IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM) < 0) {
      spdlog::warn("inotify on {}: {}; falling back to polling", options_.plugin_dir,
                   std::strerror(errno));
    }
    thread_ = std::thread([this] { Run(); });
  }
  return absl::OkStatus();
}

void PluginManager::Stop() {
  std::vector<std::shared_ptr<Entry>> old;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    old.swap(entries_);
  }
  if (thread_.joinable()) thread_.join();
  // All at once: each server drains its calls in flight for up to 500 ms, and one draining before
  // the next stops accepting kept answering Allocate (granting GPUs) for a second and more after
  // the agent was told to stop (cluster.nodes' agent restart).
  std::vector<std::thread> retiring;
  for (auto& e : old) retiring.emplace_back([server = e->server.get()] { server->Retire(); });
  for (auto& t : retiring) t.join();
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  inotify_fd_ = -1;
}

std::vector<ServerStatus> PluginManager::Status() const {
  absl::MutexLock l(&mu_);
  std::vector<ServerStatus> out;
  for (const auto& e : entries_)
    out.push_back({e->server->resource()->name(), e->server->socket(), e->registered,
                   e->registrations, e->serves, e->last_error});
  return out;
}

void PluginManager::Run() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    Tick();
    // Sleep until something happens in the directory, or one poll interval. The inotify events
    // only wake us; Tick() decides from what is on disk, so a missed or coalesced event is
    // harmless.
    struct pollfd p = {inotify_fd_, POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(options_.poll_interval));
    if (::poll(&p, inotify_fd_ >= 0 ? 1 : 0, ms) > 0) {
      char buf[4096];
      while (::read(inotify_fd_, buf, sizeof buf) > 0) {
      }
    }
  }
}

void PluginManager::Tick() {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    absl::MutexLock l(&mu_);
    entries = entries_;
  }
  const std::string kubelet_sock =
      options_.kubelet_socket.empty() ? "" : options_.plugin_dir + "/" + options_.kubelet_socket;
  const uint64_t kubelet_inode = kubelet_sock.empty() ? 0 : InodeOf(kubelet_sock);
  if (!kubelet_sock.empty() && kubelet_inode == 0) {
    absl::Time now = absl::Now();
    if (kubelet_wait_since_ == absl::InfiniteFuture()) kubelet_wait_since_ = now;
    if (now >= next_wait_log_) {
      absl::Duration waited = absl::Trunc(now - kubelet_wait_since_, absl::Seconds(1));
      spdlog::info(
          "waiting for the kubelet: {} does not exist yet ({}serving {} resource(s) "
          "meanwhile, registering as soon as it appears)",
          kubelet_sock,
          waited > absl::ZeroDuration()
              ? absl::StrCat("waited ", absl::FormatDuration(waited), "; ")
              : "",
          entries.size());
      next_wait_log_ = now + wait_log_step_;
      wait_log_step_ = std::min(wait_log_step_ * 2, absl::Minutes(1));
    }
  } else if (kubelet_wait_since_ != absl::InfiniteFuture()) {
    spdlog::info("the kubelet appeared at {} after {}", kubelet_sock,
                 absl::FormatDuration(
                     absl::Trunc(absl::Now() - kubelet_wait_since_, absl::Milliseconds(1))));
    kubelet_wait_since_ = absl::InfiniteFuture();
    next_wait_log_ = absl::InfinitePast();
    wait_log_step_ = absl::Seconds(1);
  }
  for (auto& e : entries) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    if (!e->server->SocketIntact()) {
      // The kubelet removes every socket in the directory when it starts: serve again.
      spdlog::info("socket {} was removed; serving again", e->server->socket());
      absl::Status s = e->server->Serve();
      absl::MutexLock l(&mu_);
      ++e->serves;
      e->registered = false;
      if (!s.ok()) {
        e->last_error = std::string(s.message());
        continue;
      }
    }
    if (kubelet_sock.empty() || kubelet_inode == 0) continue;  // no kubelet yet: wait for it
    bool need;
    {
      absl::MutexLock l(&mu_);
      if (e->registered && e->kubelet_inode != kubelet_inode) {
        // A new kubelet.sock means a new kubelet that does not know us yet.
        e->registered = false;
        e->backoff = options_.initial_backoff;
        e->next_attempt = Clock::TimePoint::min();
      }
      need = !e->registered && options_.clock->Now() >= e->next_attempt;
    }
    if (!need) continue;
    absl::Status s = e->server->Register(kubelet_sock, options_.register_timeout);
    absl::MutexLock l(&mu_);
    if (s.ok()) {
      e->registered = true;
      e->kubelet_inode = kubelet_inode;
      ++e->registrations;
      e->last_error.clear();
      e->backoff = options_.initial_backoff;
      spdlog::info("registered {} with the kubelet", e->server->resource()->name());
    } else {
      e->last_error = std::string(s.message());
      e->next_attempt = options_.clock->Now() + absl::ToChronoNanoseconds(e->backoff);
      spdlog::warn("{}; retrying in {}", e->last_error, absl::FormatDuration(e->backoff));
      e->backoff = std::min(e->backoff * 2, options_.max_backoff);
    }
  }
}

}  // namespace gpulet::kubelet
