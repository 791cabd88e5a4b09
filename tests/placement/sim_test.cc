// openb CSV loading (including bad rows), the arrival stream, determinism per seed, the CLI's
// error path, and a small-trace regression: gpulet allocates at least as much as FGD.
#include "placement/sim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpulet::placement {
namespace {

using ::testing::HasSubstr;

constexpr char kNodes[] =
    "sn,cpu_milli,memory_mib,gpu,model\n"
    "n0,32000,131072,2,T4\n"
    "n1,96000,393216,8,G2\n"
    "n2,8000,32768,0,\n";

constexpr char kPods[] =
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
    "p0,12000,16384,1,1000,,LS\n"
    "p1,6000,12288,1,460,T4|V100M16|T4,BE\n"
    "p2,4000,8192,0,0,,LS\n"
    "p3,32000,65536,8,1000,G2,LS\n";

std::string ErrorOf(absl::Status s) { return std::string(s.message()); }

// Good files load with every field; extra columns are ignored; gpu_spec is split and deduped.
TEST(Openb, ParsesNodesAndPods) {
  auto c = ParseOpenbNodes(kNodes, "nodes.csv");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->nodes.size(), 3u);
  EXPECT_EQ(c->nodes[1].gpus.size(), 8u);
  EXPECT_EQ(c->nodes[1].gpus[0].model, "G2");
  EXPECT_EQ(c->nodes[0].cpu_milli_free, 32000);
  EXPECT_EQ(GpuCapacityMilli(*c), 10000);
  auto p = ParseOpenbPods(kPods, "pods.csv");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 4u);
  EXPECT_EQ((*p)[0].containers[0].whole_gpus, 1);
  EXPECT_EQ((*p)[1].containers[0].milli, 460);
  EXPECT_EQ((*p)[1].gpu_models, (std::vector<std::string>{"T4", "V100M16"}));
  EXPECT_EQ((*p)[2].TotalGpuMilli(), 0);
  EXPECT_EQ((*p)[3].containers[0].whole_gpus, 8);
}

// The multigpu20 variant has no gpu_spec column: that is accepted (no model constraint).
TEST(Openb, GpuSpecColumnOptional) {
  auto p = ParseOpenbPods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,500\r\n", "x");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)[0].gpu_models.empty());
}

// Each kind of bad input gets one error naming the file and line.
TEST(Openb, BadRowsNameFileAndLine) {
  struct Case {
    std::string csv, want;
  };
  const std::string h = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (const Case& c : std::vector<Case>{
           {"", "nodes.csv:1: empty file"},
           {"sn,cpu_milli,gpu,model\nn,1,1,T4\n", "nodes.csv:1: missing column \"memory_mib\""},
           {h, "nodes.csv:1: no data rows"},
           {h + "n,1,1,1,T4\nm,x,1,1,T4\n", "nodes.csv:3: cpu_milli \"x\" is not an integer"},
           {h + "n,1,1,1\n", "nodes.csv:2: 4 fields, header has 5"},
           {h + "n,1,1,-2,T4\n", "nodes.csv:2: gpu -2 out of range"},
           {h + "n,1,1,2,\n", "nodes.csv:2: node with GPUs has no model"},
           {h + "n,1,1,1,T4\nn,1,1,1,T4\n", "nodes.csv:3: duplicate node \"n\""},
           {h + "n,1,1,1,T4\n\nm,1,1,1,T4\n", "nodes.csv:3: empty line"},
           {h + "\"n\",1,1,1,T4\n", "nodes.csv:2: quoted fields"},
       }) {
    auto r = ParseOpenbNodes(c.csv, "nodes.csv");
    ASSERT_FALSE(r.ok()) << c.csv;
    EXPECT_THAT(ErrorOf(r.status()), HasSubstr(c.want));
  }
  const std::string ph = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
  for (const Case& c : std::vector<Case>{
           {ph + "p,1,1,2,500\n", "pods.csv:2: multi-GPU task (num_gpu 2) must ask whole GPUs"},
           {ph + "p,1,1,0,300\n", "pods.csv:2: gpu_milli 300 with num_gpu 0"},
           {ph + "p,1,1,1,0\n", "pods.csv:2: num_gpu > 0 with gpu_milli 0"},
           {ph + "p,1,1,1,1001\n", "pods.csv:2: gpu_milli 1001 out of range [0, 1000]"},
           {ph + "p,1,1,1,5e2\n", "pods.csv:2: gpu_milli \"5e2\" is not an integer"},
           {ph + ",1,1,1,500\n", "pods.csv:2: empty name"},
       }) {
    auto r = ParseOpenbPods(c.csv, "pods.csv");
    ASSERT_FALSE(r.ok()) << c.csv;
    EXPECT_THAT(ErrorOf(r.status()), HasSubstr(c.want));
  }
  EXPECT_THAT(ErrorOf(LoadOpenbNodes("/nonexistent/n.csv").status()), HasSubstr("cannot open"));
}

// The arrival stream: a permutation of the trace plus draws, stopping just before the target;
// the same for the same seed, different for another.
TEST(ArrivalStream, ReachesTargetDeterministically) {
  auto pods = ParseOpenbPods(kPods, "pods.csv");
  ASSERT_TRUE(pods.ok());
  const int64_t cap = 10000;
  auto a = ArrivalStream(*pods, cap, 1.3, 5);
  auto b = ArrivalStream(*pods, cap, 1.3, 5);
  auto c = ArrivalStream(*pods, cap, 1.3, 6);
  int64_t total = 0;
  for (const auto& p : a) total += p.TotalGpuMilli();
  EXPECT_LE(total, 13000);
  EXPECT_GT(total, 13000 - 8000);  // the next draw (at most 8 GPUs) would have passed it
  ASSERT_EQ(a.size(), b.size());
  bool differs = a.size() != c.size();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    if (i < c.size() && a[i].name != c[i].name) differs = true;
  }
  EXPECT_TRUE(differs);
  // Shrinking: asking 0.5x capacity drops random tasks until the total fits.
  int64_t small = 0;
  for (const auto& p : ArrivalStream(*pods, cap, 0.5, 5)) small += p.TotalGpuMilli();
  EXPECT_LE(small, 5000);
}

std::string SampleDir() { return std::string(GPULET_SOURCE_DIR) + "/tests/placement/data"; }

// Runs a shell command; its exit code (-1 if it could not start) and what it printed on stdout.
std::pair<int, std::string> RunShell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return {WEXITSTATUS(pclose(p)), out};
}

// A run is a pure function of its inputs and seed: the same curve twice; allocation never
// exceeds what arrived or the capacity.
TEST(Simulate, DeterministicPerSeed) {
  auto c = LoadOpenbNodes(SampleDir() + "/sample_nodes.csv");
  auto t = LoadOpenbPods(SampleDir() + "/sample_pods.csv");
  ASSERT_TRUE(c.ok() && t.ok()) << c.status() << t.status();
  auto p = MakePolicy("fgd");
  (*p)->SetWorkload(WorkloadFromPods(*t));
  SimResult r1 = Simulate(*c, *t, **p, {.seed = 3});
  SimResult r2 = Simulate(*c, *t, **p, {.seed = 3});
  ASSERT_EQ(r1.curve.size(), r2.curve.size());
  for (size_t i = 0; i < r1.curve.size(); ++i) {
    EXPECT_EQ(r1.curve[i].arrived, r2.curve[i].arrived);
    EXPECT_EQ(r1.curve[i].allocated, r2.curve[i].allocated);
    EXPECT_LE(r1.curve[i].allocated, r1.curve[i].arrived + 1e-12);
  }
  EXPECT_NEAR(r1.arrived, 1.3, 0.02);
  EXPECT_GT(r1.allocated, 0.5);
  EXPECT_LE(r1.allocated, 1.0);
  EXPECT_GT(r1.failed, 0);  // 130% cannot all fit
}

// Regression on a 1/10 sample of the openb trace: gpulet's policy allocates at least as much GPU
// as FGD, summed over a few seeds (the full-trace comparison is bench/placement/run-openb).
TEST(Simulate, GpuletAtLeastFgdOnSample) {
  auto c = LoadOpenbNodes(SampleDir() + "/sample_nodes.csv");
  auto t = LoadOpenbPods(SampleDir() + "/sample_pods.csv");
  ASSERT_TRUE(c.ok() && t.ok());
  const Workload w = WorkloadFromPods(*t);
  auto fgd = MakePolicy("fgd");
  auto gpulet = MakePolicy("gpulet");
  (*fgd)->SetWorkload(w);
  (*gpulet)->SetWorkload(w);
  double a = 0, b = 0;
  for (uint64_t seed = 42; seed < 45; ++seed) {
    a += Simulate(*c, *t, **fgd, {.seed = seed}).allocated;
    b += Simulate(*c, *t, **gpulet, {.seed = seed}).allocated;
  }
  EXPECT_GE(b, a);
}

// The library behind `gpulet-sched simulate`: one run_done per (policy, seed) run, counted 1..N
// one call at a time; the results are the same on one thread and on four; the header says what
// runs and the table has a row per policy.
TEST(SimulationRun, ReportsEveryRunAndDoesNotDependOnThreads) {
  SimulationRequest req{.nodes = SampleDir() + "/sample_nodes.csv",
                        .pods = SampleDir() + "/sample_pods.csv",
                        .policies = "best-fit,fgd",
                        .seeds = 3,
                        .jobs = 4};
  auto sim = PrepareSimulation(req);
  ASSERT_TRUE(sim.ok()) << sim.status();
  ASSERT_EQ(sim->runs(), 6u);
  std::vector<size_t> done;
  SimulationReport four = RunSimulation(
      *sim, [&done](const SimResult&, size_t n) { done.push_back(n); });  // no lock: one at a time
  EXPECT_THAT(done, ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  sim->request.jobs = 1;
  SimulationReport one = RunSimulation(*sim);
  ASSERT_EQ(four.results.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(four.results[i].policy, one.results[i].policy);
    EXPECT_EQ(four.results[i].seed, one.results[i].seed);
    EXPECT_EQ(four.results[i].allocated, one.results[i].allocated);
  }
  EXPECT_EQ(FormatSimulationHeader(*sim).rfind("# " + req.pods + " x " + req.nodes + ", ", 0), 0u);
  EXPECT_THAT(FormatSimulationHeader(*sim), HasSubstr(", arrivals 1.30, seeds 42..44\n"));
  std::string table = FormatSimulationTable(sim->request, one);
  EXPECT_EQ(table.rfind("policy         alloc%    +-sd     min     max    failed    s/run\n", 0),
            0u)
      << table;
  EXPECT_THAT(table, HasSubstr("\nbest-fit "));
  EXPECT_THAT(table, HasSubstr("\nfgd "));
}

// A bad request is refused before any run, naming the flag.
TEST(SimulationRun, BadRequestNamesTheFlag) {
  SimulationRequest req{.nodes = SampleDir() + "/sample_nodes.csv",
                        .pods = SampleDir() + "/sample_pods.csv"};
  req.seeds = 0;
  EXPECT_THAT(ErrorOf(PrepareSimulation(req).status()), HasSubstr("--seeds"));
  req.seeds = 1;
  req.arrivals = 0;
  EXPECT_THAT(ErrorOf(PrepareSimulation(req).status()), HasSubstr("--arrivals"));
  req.arrivals = 1.3;
  req.policies = "no-such-policy";
  EXPECT_THAT(ErrorOf(PrepareSimulation(req).status()), HasSubstr("--policy"));
  req.policies = ",";
  EXPECT_THAT(ErrorOf(PrepareSimulation(req).status()), HasSubstr("--policy names no policy"));
}

// Progress: one line per run for logs, or a bar redrawn in place on a terminal.
TEST(SimulationRun, ProgressLinesOrBar) {
  SimResult r;
  r.policy = "fgd";
  r.seed = 43;
  r.allocated = 0.5;
  r.seconds = 1.5;
  std::ostringstream lines;
  SimulationProgress log(lines, 2, /*redraw=*/false);
  log.RunDone(r, 1);
  log.Finish();
  EXPECT_EQ(lines.str(), "run 1/2 done: fgd seed 43, 50.00% allocated (1.5 s)\n");
  std::ostringstream bar;
  SimulationProgress tty(bar, 2, /*redraw=*/true);
  tty.RunDone(r, 1);
  tty.Finish();
  EXPECT_THAT(bar.str(), HasSubstr("\r[" + std::string(30, ' ') + "] 0/2 runs, "));
  EXPECT_THAT(bar.str(),
              HasSubstr("\r[" + std::string(15, '#') + std::string(15, ' ') + "] 1/2 runs, "));
  EXPECT_EQ(bar.str().back(), '\n');
}

// The CLI: a bad row stops it with exit code 2 and file:line on stderr, and --out is not
// created; a good run writes the curve CSV.
TEST(Cli, BadInputAndOutput) {
  const std::string bin = std::string(GPULET_BINARY_DIR) + "/bin/gpulet-sched";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << "gpulet-sched not built: " << bin;
  const auto dir =
      std::filesystem::temp_directory_path() / ("placement_cli_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "bad.csv") << "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,x\n"; }
  const std::string nodes = SampleDir() + "/sample_nodes.csv";
  const std::string out = (dir / "curve.csv").string();
  std::string cmd = bin + " simulate --nodes " + nodes + " --pods " + (dir / "bad.csv").string() +
                    " --out " + out + " 2>" + (dir / "err").string();
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  std::ifstream err(dir / "err");
  std::string msg((std::istreambuf_iterator<char>(err)), {});
  EXPECT_THAT(msg, HasSubstr("bad.csv:2: gpu_milli \"x\" is not an integer"));
  EXPECT_FALSE(std::filesystem::exists(out));
  cmd = bin + " simulate --nodes " + nodes + " --pods " + SampleDir() +
        "/sample_pods.csv --policy best-fit --out " + out + " >/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream curve(out);
  std::string header;
  std::getline(curve, header);
  EXPECT_EQ(header, "policy,seed,arrived,allocated");
  std::filesystem::remove_all(dir);
}

// A long run says what it does (it printed nothing for 13-30 s): the header on stdout before the
// runs, then one progress line per (policy, seed) run on stderr when stderr is not a terminal.
TEST(Cli, HeaderFirstThenProgressOnStderr) {
  const std::string bin = std::string(GPULET_BINARY_DIR) + "/bin/gpulet-sched";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << "gpulet-sched not built: " << bin;
  // Both streams into one pipe, in the order written.
  const std::string cmd = bin + " simulate --nodes " + SampleDir() + "/sample_nodes.csv --pods " +
                          SampleDir() +
                          "/sample_pods.csv --policy best-fit,fgd --seeds 2 --jobs 1 2>&1";
  auto [rc, out] = RunShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("# ", 0), 0u) << out;
  const size_t first = out.find("run 1/4 done: best-fit seed 42, ");
  const size_t last = out.find("run 4/4 done: fgd seed 43, ");
  const size_t table = out.find("policy ");
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(last, std::string::npos) << out;
  EXPECT_LT(first, last);
  EXPECT_LT(last, table) << out;
}

// Numbers the CLI used to accept silently (issue 22): a negative seed wrapped to 2^64-5, a seed
// past 2^64-1 clamped, --jobs 0 and -3 ran. Each is refused naming the flag.
TEST(Cli, BadNumbersAreRefused) {
  const std::string bin = std::string(GPULET_BINARY_DIR) + "/bin/gpulet-sched";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << "gpulet-sched not built: " << bin;
  const std::string base = bin + " simulate --nodes " + SampleDir() + "/sample_nodes.csv --pods " +
                           SampleDir() + "/sample_pods.csv --policy best-fit ";
  for (const char* bad :
       {"--seed -5", "--seed 99999999999999999999999", "--seed 1.5", "--jobs 0", "--jobs -3"}) {
    auto [rc, out] = RunShell(base + bad + " 2>&1");
    EXPECT_NE(rc, 0) << bad << ": " << out;
    std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_THAT(out, HasSubstr(flag)) << bad;
  }
}

}  // namespace
}  // namespace gpulet::placement
