#include "moeshard/base/cpu_info.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace moeshard {
namespace {

TEST(CpuInfo, X86NamesTheFamilyAndModel) {
  // The head of a Zen 4 VM's /proc/cpuinfo: the brand alone does not say which generation.
  const char* text =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
      "model name\t: AMD EPYC\nstepping\t: 0\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n"
      "model name\t: other\n";
  EXPECT_EQ(DescribeCpu(text), "AMD EPYC (family 25 model 17)");
}

TEST(CpuInfo, ArmNamesTheImplementerAndPart) {
  const char* text =
      "processor\t: 0\nBogoMIPS\t: 243.75\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
      "CPU part\t: 0xd0c\n";
  EXPECT_EQ(DescribeCpu(text), "Arm (implementer 0x41 part 0xd0c)");
}

TEST(CpuInfo, MissingFieldsFallBack) {
  EXPECT_EQ(DescribeCpu("model name\t: Some CPU\r\n"), "Some CPU");
  EXPECT_EQ(DescribeCpu(""), "unknown");
  EXPECT_EQ(DescribeCpu("garbage without colons\n"), "unknown");
  // "model" must not match "model name" (nor the reverse).
  EXPECT_EQ(DescribeCpu("model\t\t: 17\ncpu family\t: 25\n"), "unknown");
}

TEST(CpuInfo, ReadsTheFileOrSaysUnknown) {
  const std::string path = ::testing::TempDir() + "cpuinfo_test.txt";
  {
    std::ofstream out(path);
    out << "cpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n";
  }
  EXPECT_EQ(CpuDescription(path), "Intel(R) Xeon(R) Platinum 8480+ (family 6 model 143)");
  std::remove(path.c_str());
  EXPECT_EQ(CpuDescription(path), "unknown");
  EXPECT_NE(CpuDescription(), "");  // this machine's, whatever it is
}

}  // namespace
}  // namespace moeshard
