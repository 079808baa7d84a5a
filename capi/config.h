#pragma once

#include "common/config.h"
#include "gradstream/gradstream.h"

namespace gs::capi {

/// The library configuration of one call: defaults, then the caller's gs_config_t (NULL for
/// none; only the fields its struct_size covers, each only when set), then the environment.
/// Validated, and the log level applied. Throws kInvalidArgument for a struct_size too small.
Config makeConfig(const gs_config_t* c);

}  // namespace gs::capi
