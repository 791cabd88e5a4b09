// compat_dp_probe: drives ONE device plugin process (gpulet's or NVIDIA's) through the kubelet
// emulator and prints what it answered as JSON, so tests/compat/device_plugin.sh can compare the
// two implementations on the same input and bench/compat can time them with the same client.
//
//   compat_dp_probe --dir DIR [--settle-ms 1500] [--timeout-s 60] [--repeat N]
//                   [--inject CMD [--recover CMD] [--recover-wait-s 10]] -- PLUGIN ARGV...
//
// It serves kubelet.sock in DIR, starts PLUGIN (the environment passes through), waits until at
// least one resource registered and ListAndWatch was quiet for --settle-ms, then for every
// resource: the device list (id, health, NUMA), GetPreferredAllocation for a fixed set of sizes
// and must-include cases (when the plugin offers it), and Allocate for the first one and two
// devices (errors are recorded as code + message). The plugin is then stopped with SIGTERM.
// --repeat N times GetPreferredAllocation (half the devices, must-include the last one) and
// Allocate (one device) N more times on the first resource and reports p50/p99 (timing; never
// compared). --inject runs CMD (sh -c) after the queries and reports how long until ListAndWatch
// shows a device Unhealthy; --recover runs CMD after that and reports how long until all devices
// are Healthy again, or null when that did not happen within --recover-wait-s.
// The plugin's RSS (VmRSS of its pid, after the queries) and start -> registered are in "timing".
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"
#include "testing/kubelet/emulator.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

struct Args {
  std::string dir, inject, recover;
  int settle_ms = 1500, timeout_s = 60, repeat = 0, recover_wait_s = 10;
  std::vector<std::string> argv;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "compat_dp_probe: " << why
            << "\nusage: compat_dp_probe --dir DIR [--settle-ms MS] [--timeout-s S] [--repeat N]"
               " [--inject CMD [--recover CMD] [--recover-wait-s S]] -- PLUGIN ARGV...\n";
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  int i = 1;
  auto value = [&](const char* flag) -> std::string {
    if (i + 1 >= argc) Usage(std::string(flag) + " needs a value");
    return argv[++i];
  };
  auto number = [&](const char* flag) {
    std::string v = value(flag);
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 0)
      Usage(std::string(flag) + ": \"" + v + "\" is not a number >= 0");
    return static_cast<int>(n);
  };
  for (; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--") {
      for (++i; i < argc; ++i) a.argv.push_back(argv[i]);
      break;
    }
    if (f == "--dir")
      a.dir = value("--dir");
    else if (f == "--settle-ms")
      a.settle_ms = number("--settle-ms");
    else if (f == "--timeout-s")
      a.timeout_s = number("--timeout-s");
    else if (f == "--repeat")
      a.repeat = number("--repeat");
    else if (f == "--inject")
      a.inject = value("--inject");
    else if (f == "--recover")
      a.recover = value("--recover");
    else if (f == "--recover-wait-s")
      a.recover_wait_s = number("--recover-wait-s");
    else
      Usage("unknown flag " + f);
  }
  if (a.dir.empty()) Usage("--dir is required");
  if (a.argv.empty()) Usage("no plugin command after --");
  return a;
}

pid_t Spawn(const std::vector<std::string>& argv) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> v;
    for (const auto& s : argv) v.push_back(const_cast<char*>(s.c_str()));
    v.push_back(nullptr);
    setpgid(0, 0);  // so the whole plugin tree (unshare -> plugin) is stopped together
    dup2(2, 1);     // stdout carries the probe's JSON only
    execvp(v[0], v.data());
    std::fprintf(stderr, "compat_dp_probe: cannot exec %s: %s\n", v[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

// RSS of the process group's largest member: `unshare ... plugin` leaves the plugin as a child.
long RssKiB(pid_t group) {
  long best = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = std::stoi(name);
    if (getpgid(pid) != group) continue;
    std::ifstream st(e.path() / "status");
    std::string line;
    while (std::getline(st, line))
      if (line.rfind("VmRSS:", 0) == 0)
        best = std::max(best, std::strtol(line.c_str() + 6, nullptr, 10));
  }
  return best;
}

json StatusJson(const grpc::Status& s) {
  return {{"code", static_cast<int>(s.error_code())}, {"message", s.error_message()}};
}

json AllocateJson(const v1beta1::ContainerAllocateResponse& r) {
  json env = json::object(), ann = json::object();
  std::vector<std::pair<std::string, std::string>> e(r.envs().begin(), r.envs().end());
  std::sort(e.begin(), e.end());
  for (const auto& [k, v] : e) env[k] = v;
  std::vector<std::pair<std::string, std::string>> a(r.annotations().begin(),
                                                     r.annotations().end());
  std::sort(a.begin(), a.end());
  for (const auto& [k, v] : a) ann[k] = v;
  json mounts = json::array(), devices = json::array(), cdi = json::array();
  for (const auto& m : r.mounts())
    mounts.push_back({{"container_path", m.container_path()},
                      {"host_path", m.host_path()},
                      {"read_only", m.read_only()}});
  for (const auto& d : r.devices())
    devices.push_back({{"container_path", d.container_path()},
                       {"host_path", d.host_path()},
                       {"permissions", d.permissions()}});
  for (const auto& c : r.cdi_devices()) cdi.push_back(c.name());
  return {{"envs", env},
          {"mounts", mounts},
          {"devices", devices},
          {"annotations", ann},
          {"cdi_devices", cdi}};
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  Args args = Parse(argc, argv);
  std::filesystem::create_directories(args.dir);
  gpulet::emu::KubeletEmulator kubelet({.device_plugin_dir = args.dir});
  if (auto s = kubelet.Start(); !s.ok()) {
    std::cerr << "compat_dp_probe: kubelet emulator: " << s << "\n";
    return 1;
  }
  const auto t0 = Clock::now();
  pid_t child = Spawn(args.argv);
  auto stop_child = [&] {
    kill(-child, SIGTERM);
    for (int i = 0; i < 50; ++i) {
      if (waitpid(child, nullptr, WNOHANG) == child) return;
      std::this_thread::sleep_for(100ms);
    }
    kill(-child, SIGKILL);
    waitpid(child, nullptr, 0);
  };
  auto fail = [&](const std::string& why) {
    stop_child();
    std::cerr << "compat_dp_probe: " << why << "\n";
    return 1;
  };

  // Start -> registered (first Register) -> settled (no ListAndWatch for settle-ms).
  double registered_ms = -1;
  uint64_t last_gen = 0;
  auto last_change = Clock::now();
  for (;;) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) {
      std::cerr << "compat_dp_probe: the plugin exited (status " << status
                << ") before it settled\n";
      return 3;
    }
    auto res = kubelet.Resources();
    if (registered_ms < 0 && kubelet.registrations() > 0)
      registered_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    uint64_t gen = 0;
    bool listed = !res.empty();
    for (const auto& r : res) {
      gen = std::max(gen, r.generation);
      listed = listed && r.connected && r.generation > 0;
    }
    if (gen != last_gen) {
      last_gen = gen;
      last_change = Clock::now();
    }
    if (listed && Clock::now() - last_change > std::chrono::milliseconds(args.settle_ms)) break;
    if (Clock::now() - t0 > std::chrono::seconds(args.timeout_s))
      return fail("no resource registered and listed within " + std::to_string(args.timeout_s) +
                  " s");
    std::this_thread::sleep_for(5ms);
  }

  json out = json::object();
  json resources = json::array();
  std::vector<double> pref_us, alloc_us;
  bool first = true;
  for (const auto& r : kubelet.Resources()) {
    json jr = {{"name", r.name},
               {"endpoint", r.endpoint},
               {"preferred_allocation", r.preferred_allocation},
               {"pre_start_required", r.pre_start_required}};
    std::vector<std::string> ids;
    json devs = json::array();
    for (const auto& d : r.devices) {
      ids.push_back(d.id);
      devs.push_back({{"id", d.id}, {"healthy", d.healthy}, {"numa", d.numa_nodes}});
    }
    jr["devices"] = devs;
    auto channel = grpc::CreateChannel("unix:" + args.dir + "/" + r.endpoint,
                                       grpc::InsecureChannelCredentials());
    auto stub = v1beta1::DevicePlugin::NewStub(channel);
    const int n = static_cast<int>(ids.size());

    auto preferred = [&](int size, const std::vector<std::string>& must, json* into) {
      v1beta1::PreferredAllocationRequest req;
      auto* c = req.add_container_requests();
      for (const auto& id : ids) c->add_available_deviceids(id);
      for (const auto& id : must) c->add_must_include_deviceids(id);
      c->set_allocation_size(size);
      v1beta1::PreferredAllocationResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 60s);
      auto t = Clock::now();
      grpc::Status s = stub->GetPreferredAllocation(&ctx, req, &resp);
      double us = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
      if (into != nullptr) {
        json q = {{"size", size}, {"must_include", must}};
        if (!s.ok()) {
          q["error"] = StatusJson(s);
        } else {
          std::vector<std::string> got;
          if (resp.container_responses_size() > 0)
            got.assign(resp.container_responses(0).deviceids().begin(),
                       resp.container_responses(0).deviceids().end());
          std::sort(got.begin(), got.end());
          q["result"] = got;
        }
        into->push_back(q);
      }
      return us;
    };
    auto allocate = [&](const std::vector<std::string>& want, json* into) {
      v1beta1::AllocateRequest req;
      auto* c = req.add_container_requests();
      for (const auto& id : want) c->add_devices_ids(id);
      v1beta1::AllocateResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 60s);
      auto t = Clock::now();
      grpc::Status s = stub->Allocate(&ctx, req, &resp);
      double us = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
      if (into != nullptr) {
        json q = {{"ids", want}};
        if (!s.ok())
          q["error"] = StatusJson(s);
        else if (resp.container_responses_size() > 0)
          q["response"] = AllocateJson(resp.container_responses(0));
        into->push_back(q);
      }
      return us;
    };

    if (r.preferred_allocation && n > 0) {
      json pj = json::array();
      std::vector<int> sizes = {1, 2, 4, 8, n / 2, n};
      std::sort(sizes.begin(), sizes.end());
      sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
      for (int size : sizes) {
        if (size < 1 || size > n) continue;
        preferred(size, {}, &pj);
        if (size >= 2) preferred(size, {ids[n - 1]}, &pj);
        if (size >= 3) preferred(size, {ids[0], ids[n - 1]}, &pj);
      }
      jr["preferred"] = pj;
    }
    json aj = json::array();
    if (n >= 1) allocate({ids[0]}, &aj);
    if (n >= 2) allocate({ids[0], ids[1]}, &aj);
    jr["allocate"] = aj;
    resources.push_back(jr);

    if (first && args.repeat > 0 && n > 0) {
      std::vector<std::string> must = {ids[n - 1]};
      for (int i = 0; i < args.repeat; ++i) {
        if (r.preferred_allocation) pref_us.push_back(preferred(std::max(1, n / 2), must, nullptr));
        alloc_us.push_back(allocate({ids[0]}, nullptr));
      }
    }
    first = false;
  }
  out["resources"] = resources;

  json timing = {{"start_to_registered_ms", registered_ms}, {"rss_kib", RssKiB(child)}};
  if (!pref_us.empty())
    timing["preferred_us"] = {{"n", pref_us.size()},
                              {"p50", Percentile(pref_us, 0.5)},
                              {"p99", Percentile(pref_us, 0.99)}};
  if (!alloc_us.empty())
    timing["allocate_us"] = {{"n", alloc_us.size()},
                             {"p50", Percentile(alloc_us, 0.5)},
                             {"p99", Percentile(alloc_us, 0.99)}};

  if (!args.inject.empty() && !kubelet.Resources().empty()) {
    const std::string name = kubelet.Resources().front().name;
    auto unhealthy = [&](const gpulet::emu::ResourceState& s) {
      return std::any_of(s.devices.begin(), s.devices.end(),
                         [](const auto& d) { return !d.healthy; });
    };
    uint64_t gen = kubelet.Resource(name)->generation;
    auto t = Clock::now();
    if (std::system(args.inject.c_str()) != 0)
      return fail("--inject command failed: " + args.inject);
    json xid = nullptr;
    while (Clock::now() - t < 10s) {
      auto st = kubelet.WaitForUpdate(name, gen, 100ms);
      if (st.ok()) {
        gen = st->generation;
        if (unhealthy(*st)) {
          xid = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
          break;
        }
      }
    }
    timing["inject_to_unhealthy_ms"] = xid;
    if (!args.recover.empty()) {
      auto t2 = Clock::now();
      if (std::system(args.recover.c_str()) != 0)
        return fail("--recover command failed: " + args.recover);
      json rec = nullptr;
      while (Clock::now() - t2 < std::chrono::seconds(args.recover_wait_s)) {
        auto st = kubelet.Resource(name);
        if (st && !unhealthy(*st)) {
          rec = std::chrono::duration<double, std::milli>(Clock::now() - t2).count();
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
      timing["recover_to_healthy_ms"] = rec;
    }
  }
  out["timing"] = timing;
  stop_child();
  kubelet.Stop();
  std::cout << out.dump(1) << "\n";
  return 0;
}
