// The element-wise glue operations of KernelBackend (kernel_backend.h) on host memory, shared
// by the "cpu" and "reference" backends. Private to kernels/.
//
// Thread safety: pure functions of their arguments (serial).
#pragma once

#include "moeshard/kernels/kernel_backend.h"

namespace moeshard::internal {

void HostToExpertRows(const ExpertRowsArgs& args);
void HostAddRows(const AddRowsArgs& args);
void HostCopyRows(const CopyRowsArgs& args);
void HostConvert(const ConvertArgs& args);

}  // namespace moeshard::internal
