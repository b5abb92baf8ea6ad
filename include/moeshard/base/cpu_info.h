// The CPU model as benchmark reports name it, from Linux's /proc/cpuinfo.
//
// Virtual machines often report a bare brand ("AMD EPYC"), which does not say which core
// generation ran a benchmark; the family and model numbers do (AMD family 25 holds Zen 3 and
// Zen 4: model 1 is Milan, Zen 3, model 17 Genoa, Zen 4; family 26 is Zen 5; Intel family 6
// model 143 is Sapphire Rapids).
// Arm kernels report no model name; the implementer and part codes name the core there
// (implementer 0x41 part 0xd0c is Neoverse N1).
//
// Thread safety: reads a file; no shared state.
#pragma once

#include <string>
#include <string_view>

namespace moeshard {

// The first processor's description in `cpuinfo` (the text of /proc/cpuinfo):
// "<model name> (family F model M)" on x86, "Arm (implementer I part P)" where only those fields
// exist, the model name alone where the numbers are missing, and "unknown" for text with none of
// these fields.
std::string DescribeCpu(std::string_view cpuinfo);

// DescribeCpu of the file at `path` ("unknown" when it cannot be read).
std::string CpuDescription(const std::string& path = "/proc/cpuinfo");

}  // namespace moeshard
