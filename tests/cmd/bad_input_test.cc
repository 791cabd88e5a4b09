// The operator's bad-input trial of issue 32 as tables, one per binary: each row is a command line
// (run by sh, $T a fresh temporary directory, $BUSY a port this test holds), the exit code it must
// give and the words its output must hold (and, where the class was a wrong voice, words it must
// not). Rows are grouped by the class of fault they pin: one voice, usage errors exit 2,
// validate before acting, which bind error, help, files kept as written, small truths. The
// signal handling of long-running commands, which needs timing, is a test of its own below.
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/process/spawn.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBin = std::string(GPULET_BINARY_DIR) + "/bin/";
const std::string kSrc = GPULET_SOURCE_DIR;

struct Row {
  std::string command;  // sh command line; binaries by bare name ($PATH starts with bin/)
  int code;             // expected exit code; -1: any
  std::string want;     // substring of stdout+stderr
  std::string absent;   // substring that must not appear ("" : none)
};

std::ostream& operator<<(std::ostream& o, const Row& r) { return o << r.command; }

// A listening TCP socket on 127.0.0.1, for "address in use" rows.
class BusyPort {
 public:
  BusyPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd_, 1) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port_ = ntohs(a.sin_port);
  }
  ~BusyPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class BadInput : public ::testing::TestWithParam<Row> {
 protected:
  void SetUp() override {
    for (const char* b : {"gpulet", "gpulet-sim", "gpulet-sched", "gpulet-container-runtime",
                          "gpulet-container-hook"})
      if (access((kBin + b).c_str(), X_OK) != 0) GTEST_SKIP() << b << " is not built";
    char tmpl[] = "/tmp/gpulet-bad-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // Inputs some rows edit: an engine config with the user's comments, a daemon.json, a pod
    // with a bare-number run time.
    std::ofstream(dir_ + "/config.toml")
        << "# my comment: keep this\nversion = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n"
           "  # another comment\n  sandbox_image = \"pause:3.9\"\n";
    std::ofstream(dir_ + "/daemon.json") << "{}\n";
    std::ofstream(dir_ + "/bare.yaml")
        << "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bare\n  annotations:\n"
           "    sim.gpulet.io/run-time: \"1\"\nspec:\n  containers:\n  - name: c\n    image: "
           "busybox\n"
           "    resources:\n      limits:\n        nvidia.com/gpu: 1\n";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void Check(const Row& r) {
    BusyPort busy;
    ASSERT_GT(busy.port(), 0);
    std::string cmd = std::regex_replace(r.command, std::regex("\\$T"), dir_);
    cmd = std::regex_replace(cmd, std::regex("\\$BUSY"), std::to_string(busy.port()));
    const char* path = getenv("PATH");
    auto [code, out] = gpulet::testing_process::RunCaptured(
        {"/bin/sh", "-c", "cd " + kSrc + " && " + cmd},
        {{"PATH", kBin + ":" + (path ? path : "/usr/bin:/bin")}});
    if (r.code >= 0) EXPECT_EQ(code, r.code) << cmd << "\n" << out;
    EXPECT_THAT(out, HasSubstr(std::regex_replace(r.want, std::regex("\\$T"), dir_))) << cmd;
    if (!r.absent.empty()) EXPECT_THAT(out, Not(HasSubstr(r.absent))) << cmd;
  }

  std::string dir_;
};

TEST_P(BadInput, Row) { Check(GetParam()); }

// A simulated node's flags, for the commands that open GPUs.
const std::string kSim = " --simulate pcie-t4 --sim-root $T/sim";
const std::string kAgent = "timeout -s INT 20 gpulet agent" + kSim +
                           " --device-plugin-dir $T --kubelet-socket '' --labels-output $T/f";
const std::string kDevicePlugin =
    "timeout -s INT 20 gpulet device-plugin" + kSim + " --device-plugin-dir $T --kubelet-socket ''";
const std::string kSchedulerNoApi = "timeout 20 gpulet scheduler --kubeconfig $T/none";
const std::string kOpenb =
    " --nodes data/openb/openb_node_list_gpu_node.csv --pods data/openb/openb_pod_list_default.csv";

// gpulet: every command in one voice, "gpulet <command>: <what>", usage errors exit 2.
INSTANTIATE_TEST_SUITE_P(
    Gpulet, BadInput,
    ::testing::Values(
        // One voice: CLI11's errors carry the command, and a hint at any depth.
        Row{"gpulet exporter --adress :1", 2,
            "gpulet exporter: not expected: --adress :1. Did you mean --address?", ""},
        Row{"gpulet sim fault set --gpu 0 --power 1 --sim-root $T/sim", 2,
            "not expected: --power 1. Did you mean --power-mw?", ""},
        // Log lines and errors without absl's code names or the JSON library's exception text.
        Row{"printf '{\"uuid\": 5}' > $T/iso.json && " + kDevicePlugin +
                " --unhealthy-devices-file $T/iso.json & sleep 3; kill -INT $!; wait",
            -1, "$T/iso.json: \"uuid\" must be a list", "INVALID_ARGUMENT"},
        Row{"mkdir $T/empty && gpulet validate --host-root $T/empty --no-probe", 1,
            "no NVML library under $T/empty", "NOT_FOUND:"},
        // A host root that is not there is a typing mistake, said before anything is looked for.
        Row{"gpulet validate --host-root $T/none --no-probe", 2,
            "gpulet validate: --host-root: Directory does not exist: $T/none", "NVML"},
        Row{"gpulet install --host-root $T/none --runtime containerd", 2,
            "gpulet install: --host-root: Directory does not exist: $T/none", "NVML"},
        Row{"printf '{\"a\": [1,' > $T/bad.json && gpulet runtime configure --runtime docker "
            "--config $T/bad.json --dry-run",
            2, "$T/bad.json:1:", "json.exception"},
        Row{"gpulet cdi generat", 2, "Did you mean generate?", ""},
        Row{"gpulet runtime configure --runtime dockr", 2, "gpulet runtime configure: --runtime",
            ""},
        Row{"gpulet sim fault xdi --sim-root $T/sim", 2, "Did you mean xid?", ""},
        // The flag as typed, checked before anything serves.
        Row{kAgent + " --metrics-interval 10", 2, "gpulet agent: --metrics-interval \"10\"",
            "Registered"},
        Row{kAgent + " --metrics-families bogus", 2,
            "gpulet agent: --metrics-families: unknown family set 'bogus'", ""},
        Row{kDevicePlugin + " --vgpu-policy bogus", 2, "unknown vGPU policy \"bogus\"", ""},
        Row{kSchedulerNoApi + " --webhook-listen 127.0.0.1:0 --tls-cert-file $T/no.crt "
                              "--tls-key-file $T/no.key",
            2, "gpulet scheduler: --tls-cert-file cannot open", "kubeconfig"},
        Row{kSchedulerNoApi + " --max-memory-units -1", 2, "--max-memory-units", "kubeconfig"},
        Row{kSchedulerNoApi + " --extender-listen 127.0.0.1:$BUSY", 1,
            "--extender-listen: cannot listen on 127.0.0.1:", "kubeconfig"},
        // Which bind error it was.
        Row{"timeout -s INT 20 gpulet exporter" + kSim + " --address 127.0.0.1:$BUSY", 1,
            "address in use (another process listens there)", ""},
        Row{"timeout -s INT 20 gpulet exporter" + kSim + " --address 192.0.2.1:9400", 1,
            "no such address on this host", ""},
        // Runtime failures name what the user gave, not our temporary files.
        Row{"gpulet labels --oneshot" + kSim + " --output $T/daemon.json/features", 1,
            "gpulet labels: feature file $T/daemon.json/features: cannot", "labels: labels:"},
        Row{"gpulet labels --oneshot" + kSim + " --output $T", 1, "cannot write $T: Is a directory",
            ".tmp"},
        // Usage errors exit 2.
        Row{"gpulet cdi generate" + kSim + " --kind bogus", 2,
            "gpulet cdi generate: kind \"bogus\" is not vendor/class", ""},
        Row{"gpulet runtime configure --runtime docker --config $T/daemon.json "
            "--runtime-path relative/shim",
            2, "is not absolute", ""},
        // Files kept as the user wrote them; the self-import refused; a missing runtime said.
        Row{"gpulet runtime configure --runtime containerd --config $T/config.toml "
            "--drop-in-config $T/config.toml --runtime-path /bin/true",
            2, "would import itself", ""},
        Row{"gpulet runtime configure --runtime containerd --config $T/config.toml "
            "--drop-in-config $T/99-gpulet.toml --runtime-path /bin/true >/dev/null 2>&1 && "
            "cat $T/config.toml",
            0, "# another comment", ""},
        Row{"gpulet runtime configure --runtime docker --config $T/daemon.json "
            "--runtime-path /nonexistent/shim --set-as-default",
            0, "warning: --runtime-path /nonexistent/shim: no such executable", ""},
        // Help: defaults, allowed values and an example.
        Row{"gpulet exporter --help", 0, "(default: :9400)", "ADDR=:9400"},
        Row{"gpulet agent --help", 0, "Example:\n  gpulet agent", ""},
        Row{"gpulet cdi generate --help", 0, "Example:\n  gpulet cdi generate", ""},
        Row{"gpulet --help", 0, "Example:", ""},
        // Small truths: the deprecation the docs promise, durations as written.
        Row{"timeout -s INT 60 gpulet sim --simulate pcie-t4 --sim-root $T/bare $T/bare.yaml", 0,
            "a bare number is read as seconds (deprecated); write 1s", ""},
        Row{"timeout -s INT 60 gpulet sim --simulate pcie-t4 --sim-root $T/bare $T/bare.yaml", 0,
            "simulated run time 1s over", "1000ms"}));

// gpulet-sched: its own name and version; --out checked before the simulation runs.
INSTANTIATE_TEST_SUITE_P(
    Sched, BadInput,
    ::testing::Values(
        Row{"gpulet-sched simulate" + kOpenb + " --seeds 1 --out $T/daemon.json/c.csv", 2,
            "gpulet-sched simulate: --out $T/daemon.json/c.csv: no such directory", "allocated"},
        Row{"gpulet-sched --version", 0, "gpulet-sched 0.", ""},
        Row{"gpulet-sched simulate --help", 0, "Usage: gpulet-sched simulate", "bin/gpulet-sched"},
        Row{"gpulet-sched simulate --help", 0, "Example:\n  gpulet-sched simulate", ""},
        Row{"gpulet-sched simulte", 2,
            "gpulet-sched: A subcommand is required. Did you mean simulate?", ""}));

// gpulet-container-hook: usage errors exit 2 in "gpulet-container-hook <command>: ...";
// help on every command.
INSTANTIATE_TEST_SUITE_P(
    Hook, BadInput,
    ::testing::Values(
        Row{"gpulet-container-hook", 2, "gpulet-container-hook: a command is required", ""},
        Row{"gpulet-container-hook prestrat", 2, "did you mean prestart?", ""},
        Row{"gpulet-container-hook update-ldcache --help", 0, "update-ldcache [--config FILE]",
            "unknown"},
        Row{"gpulet-container-hook update-ldcache --folder lib", 2,
            "gpulet-container-hook update-ldcache: --folder \"lib\" is not an absolute", ""},
        Row{"gpulet-container-hook prestart --config", 2,
            "gpulet-container-hook prestart: --config needs a value", ""},
        Row{"gpulet-container-hook prestart --confg x", 2, "did you mean --config?", ""}));

// gpulet-container-runtime: its help names where its configuration comes from.
INSTANTIATE_TEST_SUITE_P(Runtime, BadInput,
                         ::testing::Values(Row{"gpulet-container-runtime --help", -1,
                                               "GPULET_RUNTIME_CONFIG", ""}));

// Every command's --help ends with an example (the commands as `gpulet --help` lists them).
TEST(Help, EveryGpuletCommandHasAnExample) {
  if (access((kBin + "gpulet").c_str(), X_OK) != 0) GTEST_SKIP() << "gpulet is not built";
  auto [code, out] = gpulet::testing_process::RunCaptured({kBin + "gpulet", "--help"});
  ASSERT_EQ(code, 0) << out;
  std::istringstream in(out.substr(out.find("Subcommands:")));
  std::string line;
  std::getline(in, line);
  int commands = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name;
    if (line.empty()) break;  // the end of the list
    if (!(words >> name) || line.rfind("  ", 0) != 0) continue;
    if (name == "sim") continue;  // gpulet-sim's own help, checked by the Gpulet rows
    ++commands;
    auto [c, help] = gpulet::testing_process::RunCaptured({kBin + "gpulet", name, "--help"});
    EXPECT_EQ(c, 0) << name;
    EXPECT_THAT(help, HasSubstr("Example:\n  gpulet " + name)) << name;
  }
  EXPECT_GT(commands, 8) << out;
}

// Each --help of ours (every gpulet command and the subcommands under them, gpulet-sim,
// gpulet-sched simulate) names its allowed values in full and its default once: no list that ends
// in "...", and no option line with two defaults (e.g. "(default: number of CPUs) (default: 0)").
TEST(Help, ListsAreWholeAndDefaultsSaidOnce) {
  if (access((kBin + "gpulet").c_str(), X_OK) != 0 || access((kBin + "gpulet-sched").c_str(), X_OK))
    GTEST_SKIP() << "gpulet and gpulet-sched are not built";
  std::vector<std::vector<std::string>> commands = {{kBin + "gpulet-sched", "simulate"},
                                                    {kBin + "gpulet-sim"}};
  for (const char* c : {"agent", "cdi", "cdi generate", "device-plugin", "dra-driver", "exporter",
                        "info", "install", "labels", "runtime", "runtime configure", "scheduler",
                        "uninstall", "validate"}) {
    std::vector<std::string> argv = {kBin + "gpulet"};
    std::istringstream words(c);
    for (std::string w; words >> w;) argv.push_back(w);
    commands.push_back(argv);
  }
  const std::regex elided("(,|\\|) \\.\\.\\."), twice("\\(default[^\\n]*\\(default");
  for (std::vector<std::string> argv : commands) {
    argv.push_back("--help");
    auto [code, help] = gpulet::testing_process::RunCaptured(argv);
    const std::string who = argv.size() > 2 ? argv[1] : argv[0];
    EXPECT_EQ(code, 0) << who << ": " << help;
    std::istringstream lines(help);
    for (std::string line; std::getline(lines, line);) {
      EXPECT_FALSE(std::regex_search(line, elided)) << who << ": " << line;
      EXPECT_FALSE(std::regex_search(line, twice)) << who << ": " << line;
    }
  }
}

// The help of --vgpu-policy names every policy the node and the extender accept (the list the
// scheduler's refusal prints), so the two cannot drift apart.
TEST(Help, VgpuPolicyNamesEveryPolicy) {
  if (access((kBin + "gpulet").c_str(), X_OK) != 0) GTEST_SKIP() << "gpulet is not built";
  auto [code, refusal] =
      gpulet::testing_process::RunCaptured({kBin + "gpulet", "scheduler", "--policy", "bogus"});
  EXPECT_EQ(code, 2) << refusal;
  std::smatch known;
  ASSERT_TRUE(std::regex_search(refusal, known, std::regex("known: ([a-z, -]+)\\)"))) << refusal;
  auto [c, help] = gpulet::testing_process::RunCaptured({kBin + "gpulet", "agent", "--help"});
  ASSERT_EQ(c, 0);
  std::smatch line;
  ASSERT_TRUE(std::regex_search(help, line, std::regex("--vgpu-policy[^\\n]*"))) << help;
  std::istringstream names(known[1].str());
  int n = 0;
  for (std::string name; std::getline(names, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    EXPECT_THAT(line[0].str(), HasSubstr(name)) << name;
    ++n;
  }
  EXPECT_GE(n, 3) << refusal;
}

// A long-running command stops within a second of SIGINT, even while a pod's simulated run time
// (1h30m) is still going (both signals used to stay pending); SIGKILL takes its agent with it.
TEST(Signals, SimStopsOnSigintAndItsAgentDiesWithIt) {
  if (access((kBin + "gpulet-sim").c_str(), X_OK) != 0 || access((kBin + "gpulet").c_str(), X_OK))
    GTEST_SKIP() << "gpulet and gpulet-sim are not built";
  char tmpl[] = "/tmp/gpulet-sig-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/long.yaml")
      << "apiVersion: v1\nkind: Pod\nmetadata:\n  name: long\n  annotations:\n"
         "    sim.gpulet.io/run-time: 1h30m\nspec:\n  containers:\n  - name: c\n    image: "
         "busybox\n"
         "    resources:\n      limits:\n        nvidia.com/gpu: 1\n";
  auto run = [&](int sig, const std::string& root, std::string* log, int* agent) {
    *log = dir + "/" + root + ".log";
    pid_t pid =
        gpulet::testing_process::SpawnLogged({kBin + "gpulet", "sim", "--simulate", "pcie-t4",
                                              "--sim-root", dir + "/" + root, dir + "/long.yaml"},
                                             *log);
    // Running: the pod started and its run time is going.
    std::string text;
    for (int i = 0; i < 600 && text.find("simulated run time 1h30m") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream f(*log);
      text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    std::smatch m;
    *agent = std::regex_search(text, m, std::regex("\\(pid ([0-9]+),")) ? std::stoi(m[1]) : -1;
    EXPECT_THAT(text, HasSubstr("simulated run time 1h30m"));
    auto t0 = std::chrono::steady_clock::now();
    kill(pid, sig);
    int st = gpulet::testing_process::StopProcess(pid, std::chrono::seconds(10));
    return std::make_pair(st, std::chrono::steady_clock::now() - t0);
  };
  std::string log;
  int agent = -1;
  auto [st, took] = run(SIGINT, "int", &log, &agent);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGINT) << st;
  // The agent's own stop (SIGTERM, its teardown) is part of it: a second, not the pod's 1h30m.
  EXPECT_LT(took, std::chrono::seconds(2));
  std::ifstream f(log);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("Received SIGINT, stopping."));

  auto [st9, took9] = run(SIGKILL, "kill", &log, &agent);
  ASSERT_GT(agent, 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    // Gone, or a zombie not reaped yet by whoever inherited it.
    std::ifstream stat("/proc/" + std::to_string(agent) + "/stat");
    std::string stat_text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t close_paren = stat_text.rfind(')');
    gone = kill(agent, 0) != 0 ||
           (close_paren != std::string::npos && stat_text.substr(close_paren + 2, 1) == "Z");
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "agent " << agent << " outlived its runner";
  if (!gone) kill(agent, SIGKILL);
  fs::remove_all(dir);
}

}  // namespace
