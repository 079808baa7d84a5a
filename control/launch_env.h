#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "control/communicator.h"

namespace gs::control {

/// Rank, size and rendezvous address as a launcher left them in the environment.
struct LaunchEnvironment {
  int rank = -1;
  int nranks = -1;
  std::string rankVariable;  // which variable supplied the rank, for messages
  std::string masterAddr;
  uint16_t masterPort = 0;
};

/// Reads RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/SIZE (mpirun), SLURM_PROCID/
/// SLURM_NTASKS (srun) or PMI_RANK/PMI_SIZE, plus MASTER_ADDR and MASTER_PORT. Throws
/// kInvalidArgument naming the missing or malformed variable.
LaunchEnvironment readLaunchEnvironment();

/// gs_comm_init_from_env: rank 0 starts the rendezvous on MASTER_ADDR:MASTER_PORT, every rank
/// joins it. The secret is GS_SECRET (config.secret) or, with a warning, derived from the
/// rendezvous address and world size.
std::unique_ptr<Communicator> createFromEnvironment(const Config& config);

}  // namespace gs::control
