// The launcher seam: which launcher `--comm` and the launch environment select (a literal
// environment map, never setenv), what the MPI environment says, and the local launcher run end
// to end. The MPI launcher itself runs under mpirun in the `mpi`-labelled tests.
#include "moeshard/comm/launcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "comm/launcher_registry.h"

namespace moeshard {
namespace {

std::string Resolved(const std::string& comm, const LaunchEnv& env, int world = 4) {
  Result<std::string> r = ResolveLauncher({.comm = comm, .world = world, .env = env});
  return r.ok() ? *r : "error: " + r.status().message();
}

// What mpirun / mpiexec / srun set (the values of an `mpirun -np 4` on two nodes).
const LaunchEnv kOpenMpi = {{"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
const LaunchEnv kPmix = {{"PMIX_RANK", "0"}};
const LaunchEnv kHydra = {{"PMI_SIZE", "4"}, {"PMI_RANK", "3"}};
const LaunchEnv kSlurmPmi = {{"PMI_RANK", "0"}};

TEST(LauncherTest, AutoPicksMpiUnderEveryMpiLauncher) {
  for (const LaunchEnv& env : {kOpenMpi, kPmix, kHydra, kSlurmPmi}) {
    SCOPED_TRACE(env.begin()->first);
    EXPECT_EQ(Resolved("", env), "mpi");
    EXPECT_EQ(Resolved("auto", env), "mpi");
    EXPECT_EQ(Resolved("mpi", env), "mpi");
    // Asked for, local runs the ranks as threads even under mpirun.
    EXPECT_EQ(Resolved("local", env), "local");
  }
}

TEST(LauncherTest, AutoPicksLocalOtherwise) {
  EXPECT_EQ(Resolved("", {}), "local");
  EXPECT_EQ(Resolved("auto", {}), "local");
  EXPECT_EQ(Resolved("local", {}), "local");
  // Variables no launcher declares (nor the rank alone of OpenMPI) say nothing.
  EXPECT_EQ(Resolved("", {{"OMPI_COMM_WORLD_RANK", "0"}, {"SLURM_PROCID", "0"}}), "local");
}

TEST(LauncherTest, ErrorsNameTheValueAndTheFix) {
  EXPECT_EQ(Resolved("nccl", {}), "error: '--comm nccl': expected local or mpi");
  EXPECT_EQ(Resolved("MPI", kOpenMpi), "error: '--comm MPI': expected local or mpi");
  EXPECT_EQ(Resolved("mpi", {}),
            "error: '--comm mpi': expected to run under mpirun (mpirun -np 4 moeshard run ...)");
  Result<std::string> r =
      ResolveLauncher({.comm = "mpi", .world = 8, .command = "moeshard bench run", .env = {}});
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "'--comm mpi': expected to run under mpirun (mpirun -np 8 moeshard bench run)");
  // Creating fails the same way, before anything starts.
  auto l = CreateLauncher({.comm = "mpi", .world = 2, .env = {}});
  EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition);
}

TEST(LauncherTest, ReadsWhatTheMpiEnvironmentSays) {
  MpiLaunchInfo i = ReadMpiLaunchInfo(kOpenMpi);
  EXPECT_TRUE(i.launched);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_size, 2);
  i = ReadMpiLaunchInfo(kHydra);
  EXPECT_TRUE(i.launched);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_size, 0);  // Hydra does not say
  i = ReadMpiLaunchInfo(kPmix);
  EXPECT_TRUE(i.launched);
  EXPECT_EQ(i.world_size, 0);
  i = ReadMpiLaunchInfo({});
  EXPECT_FALSE(i.launched);
  EXPECT_EQ(i.world_size, 0);
  EXPECT_EQ(i.local_size, 0);
  // Malformed sizes read as unknown.
  i = ReadMpiLaunchInfo({{"OMPI_COMM_WORLD_SIZE", "x"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "-3"}});
  EXPECT_TRUE(i.launched);
  EXPECT_EQ(i.world_size, 0);
  EXPECT_EQ(i.local_size, 0);
}

TEST(LauncherTest, TheProcessEnvironmentHoldsOnlyLaunchersVariables) {
  std::set<std::string> declared;
  for (const comm_internal::LauncherEntry& l : comm_internal::Launchers()) {
    for (const char* v : l.env_vars) declared.insert(v);
  }
  EXPECT_TRUE(declared.count("OMPI_COMM_WORLD_SIZE"));
  EXPECT_TRUE(declared.count("OMPI_COMM_WORLD_LOCAL_SIZE"));
  EXPECT_TRUE(declared.count("PMI_RANK"));
  for (const auto& [name, value] : ProcessLaunchEnv()) {
    EXPECT_TRUE(declared.count(name)) << name;
  }
}

TEST(LauncherTest, LocalRunsEveryRankAsAThreadOfThisProcess) {
  auto l = CreateLauncher({.comm = "local", .world = 3, .env = kOpenMpi});
  ASSERT_TRUE(l.ok()) << l.status().message();
  Launcher& launcher = **l;
  EXPECT_STREQ(launcher.name(), "local");
  EXPECT_EQ(launcher.world(), 3);
  EXPECT_EQ(launcher.ranks_per_node(), 3);  // the MPI environment does not apply
  EXPECT_TRUE(launcher.in_process());
  EXPECT_GE(launcher.DefaultThreadsPerRank(), 1);
  const std::vector<std::vector<int>> cpus = launcher.RankCpus(1, nullptr);
  EXPECT_TRUE(cpus.empty() || cpus.size() == 3u);
  std::mutex mu;
  std::set<int> ranks;
  const Status s = launcher.Run([&](Communicator& world) -> Status {
    EXPECT_EQ(world.size(), 3);
    std::lock_guard<std::mutex> lock(mu);
    ranks.insert(world.rank());
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

TEST(LauncherTest, LocalReportsTheFailingRank) {
  auto l = CreateLauncher({.comm = "auto", .world = 2, .env = {}});
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_STREQ((*l)->name(), "local");
  const Status s = (*l)->Run([](Communicator& world) -> Status {
    if (world.rank() == 1) return InvalidArgumentError("deliberate");
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[rank 1/2]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("deliberate"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moeshard
