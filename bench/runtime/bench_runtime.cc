// Container-start cost of gpulet's runtime pieces, measured as whole processes (fork+exec+wait),
// the way an engine pays for them:
//   BM_Exec/direct        the low-level runtime alone (/bin/true standing in for runc)
//   BM_Exec/shim_gpu      gpulet-container-runtime `create` for a GPU container (load config,
//                         read+parse the 8-GPU CDI spec in JSON, edit and atomically rewrite
//                         config.json), then exec of /bin/true. Added time = shim_gpu - direct.
//   BM_Exec/shim_gpu_yaml the same with the spec in YAML (yaml-cpp's scanner)
//   BM_Exec/shim_nogpu    the same for a container without GPUs (parse config.json, pass through)
//   BM_Exec/shim_state    a pass-through command (`state`): no bundle work at all
//   BM_Hook/ldcache       gpulet-container-hook update-ldcache: state on stdin, config.json, setns,
//                         chroot, the host's ldconfig over the container's library folder (root
//                         only)
//   BM_Hook/prestart_nogpu  the legacy prestart hook for a container without GPUs
//   BM_ParseCdiSpec/json|yaml  ParseCdiSpec of that 8-GPU spec in-process (no exec)
// config.json is restored before every iteration (outside the timing). BM_Exec also reports
// child_cpu_us: the spawned processes' own CPU time (user+system, wait4), which stays meaningful
// when other builds hold the cores and inflate the wall time.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "benchmark/benchmark.h"
#include "runtime/cdi.h"
#include "testing/runtime/fixtures.h"

extern char** environ;

namespace gpulet::runtime {
namespace {

using namespace ::gpulet::runtime::testing;
namespace fs = std::filesystem;

const std::string kBin = std::string(GPULET_BINARY_DIR) + "/bin/";

struct World {
  std::string dir, config_json_gpu, config_json_plain;
  bool root = IsRoot();
  World() {
    dir = MakeTempDir("bench");
    std::string why;
    MakeDriverRoot(dir + "/driver", 8, &why);
    MakeBusyboxRootfs(dir + "/bundle/rootfs", &why);
    CdiGenerateOptions opt;
    opt.driver_root = dir + "/driver";
    opt.hook_path = kBin + "gpulet-container-hook";
    auto spec = GenerateCdiSpec(FakeInventory(8), opt);
    if (spec.ok()) {
      // Without root there are no device nodes to stat: give the numbers in the spec.
      for (auto& d : spec->devices)
        for (auto& n : d.edits.device_nodes)
          n.type = "c", n.major = 195, n.minor = 0, n.file_mode = 0666;
      for (auto& n : spec->edits.device_nodes)
        n.type = "c", n.major = 195, n.minor = 255, n.file_mode = 0666;
      WriteFile(dir + "/cdi/nvidia.json", CdiSpecToJson(*spec));
      WriteFile(dir + "/cdi-yaml/nvidia.yaml", CdiSpecToYaml(*spec));
    }
    for (const char* v : {"cdi", "cdi-yaml"})
      WriteFile(dir + "/runtime-" + v + ".json",
                Json({{"runtimes", {"/bin/true"}},
                      {"spec-dirs", {dir + "/" + v}},
                      {"accept-nvidia-visible-devices-envvar-when-unprivileged", true}})
                    .dump());
    Json base = {{"ociVersion", "1.0.2"},
                 {"process", {{"args", {"sh"}}, {"env", {"PATH=/bin"}}, {"cwd", "/"}}},
                 {"root", {{"path", "rootfs"}}},
                 {"mounts", Json::array()}};
    config_json_plain = base.dump(2);
    base["process"]["env"].push_back("NVIDIA_VISIBLE_DEVICES=3");
    config_json_gpu = base.dump(2);
    WriteFile(dir + "/state.json", Json({{"ociVersion", "1.0.2"},
                                         {"id", "b"},
                                         {"pid", ::getpid()},
                                         {"bundle", dir + "/bundle"}})
                                       .dump());
  }
  ~World() { fs::remove_all(dir); }
};

World& W() {
  static World w;  // removed at exit
  return w;
}

// Runs the command to completion; adds the child's CPU time (user + system, from wait4) to
// *cpu_us: unlike wall time it does not grow when other processes hold the cores.
int Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
          const std::string& stdin_file = "", double* cpu_us = nullptr) {
  std::vector<char*> a, e;
  for (const auto& s : args) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!stdin_file.empty())
    posix_spawn_file_actions_addopen(&fa, 0, stdin_file.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int st = 0;
  struct rusage ru {};
  wait4(pid, &st, 0, &ru);
  if (cpu_us)
    *cpu_us +=
        (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void BM_Exec(benchmark::State& state, const std::string& what) {
  World& w = W();
  std::string cdi = what == "shim_gpu_yaml" ? "cdi-yaml" : "cdi";
  std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                                  "GPULET_RUNTIME_CONFIG=" + w.dir + "/runtime-" + cdi + ".json"};
  std::vector<std::string> args;
  if (what == "direct")
    args = {"/bin/true", "create", "--bundle", w.dir + "/bundle", "b"};
  else if (what == "shim_state")
    args = {kBin + "gpulet-container-runtime", "state", "b"};
  else
    args = {kBin + "gpulet-container-runtime", "create", "--bundle", w.dir + "/bundle", "b"};
  const std::string& cfg = what == "shim_nogpu" ? w.config_json_plain : w.config_json_gpu;
  double cpu_us = 0;
  for (auto _ : state) {
    state.PauseTiming();
    WriteFile(w.dir + "/bundle/config.json", cfg);
    state.ResumeTiming();
    if (Spawn(args, env, "", &cpu_us) != 0) {
      state.SkipWithError("command failed");
      break;
    }
  }
  state.counters["child_cpu_us"] = benchmark::Counter(cpu_us, benchmark::Counter::kAvgIterations);
}

void BM_Hook(benchmark::State& state, const std::string& what) {
  World& w = W();
  if (what == "ldcache" && !w.root) {
    state.SkipWithError("needs root (setns/chroot)");
    return;
  }
  std::vector<std::string> args = {kBin + "gpulet-container-hook"};
  if (what == "ldcache")
    args.insert(args.end(), {"update-ldcache", "--folder", kLibDir});
  else
    args.insert(args.end(), {"prestart", "--config", w.dir + "/runtime-cdi.json"});
  WriteFile(w.dir + "/bundle/config.json", w.config_json_plain);
  fs::create_directories(w.dir + "/bundle/rootfs" + kLibDir);
  for (auto _ : state) {
    if (Spawn(args, {"PATH=/usr/bin:/bin"}, w.dir + "/state.json") != 0) {
      state.SkipWithError("hook failed");
      break;
    }
  }
}

// In-process: reading the 8-GPU spec (the part of shim_gpu the spec format decides).
void BM_ParseCdiSpec(benchmark::State& state, const std::string& file) {
  std::string text = ReadFile(W().dir + file);
  for (auto _ : state) {
    auto spec = ParseCdiSpec(text, file);
    if (!spec.ok()) {
      state.SkipWithError("parse failed");
      break;
    }
    benchmark::DoNotOptimize(spec);
  }
}

BENCHMARK_CAPTURE(BM_ParseCdiSpec, json, std::string("/cdi/nvidia.json"))
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ParseCdiSpec, yaml, std::string("/cdi-yaml/nvidia.yaml"))
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Exec, direct, std::string("direct"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Exec, shim_gpu, std::string("shim_gpu"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Exec, shim_gpu_yaml, std::string("shim_gpu_yaml"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Exec, shim_nogpu, std::string("shim_nogpu"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Exec, shim_state, std::string("shim_state"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Hook, ldcache, std::string("ldcache"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Hook, prestart_nogpu, std::string("prestart_nogpu"))
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpulet::runtime

BENCHMARK_MAIN();
