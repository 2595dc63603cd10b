// The profiled steps as one tab-separated file, for scripts that compare them with another
// framework's profile (scripts/kernel_categories.py): the step, each op and pass, and on a
// traced GPU step every kernel and copy with the op that launched it. Per-step means.
#pragma once

#include <string>
#include <vector>

#include "core/op_profile.h"

namespace precis::train {

// Writes `path`: a comment line, then the header "kind  op  name  calls  ms" and one row per
//   step  -           -                1      the measured step
//   op    conv2d fwd  -                calls  its event time (as the op table)
//   kernel conv2d fwd short kernel name calls its GPU time ("(outside ops)" when launched outside ops)
//   copy  conv2d fwd  Memcpy DtoD ...  calls  its GPU time (memcpy and memset)
// Collectives (the communication stream) are left out, as in the kernel table.
void write_profile_tsv(const std::string& path, const std::vector<ProfiledStep>& steps);

}  // namespace precis::train
