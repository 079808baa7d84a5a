#include "control/launch_env.h"

#include <cstdlib>

#include "common/error.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/net.h"

namespace gs::control {
namespace {

const char* env(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int parseNonNegative(const char* name, const char* text) {
  char* end = nullptr;
  long v = strtol(text, &end, 10);
  GS_CHECK(end != text && *end == '\0' && v >= 0 && v <= (1 << 24), Errc::kInvalidArgument,
           "%s='%s' is not a valid number", name, text);
  return static_cast<int>(v);
}

}  // namespace

LaunchEnvironment readLaunchEnvironment() {
  static const char* const kPairs[][2] = {{"RANK", "WORLD_SIZE"},
                                          {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                          {"SLURM_PROCID", "SLURM_NTASKS"},
                                          {"PMI_RANK", "PMI_SIZE"}};
  LaunchEnvironment out;
  for (const auto& pair : kPairs) {
    const char* rank = env(pair[0]);
    if (rank == nullptr)
      continue;
    const char* size = env(pair[1]);
    GS_CHECK(size != nullptr, Errc::kInvalidArgument, "%s is set but %s is not", pair[0], pair[1]);
    out.rank = parseNonNegative(pair[0], rank);
    out.nranks = parseNonNegative(pair[1], size);
    out.rankVariable = pair[0];
    GS_CHECK(out.nranks >= 1 && out.rank < out.nranks, Errc::kInvalidArgument,
             "%s=%d is out of range for %s=%d", pair[0], out.rank, pair[1], out.nranks);
    break;
  }
  GS_CHECK(out.rank >= 0, Errc::kInvalidArgument,
           "no rank in the environment: set RANK and WORLD_SIZE, or launch with torchrun, srun "
           "or mpirun");
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  GS_CHECK(addr != nullptr, Errc::kInvalidArgument,
           "MASTER_ADDR is not set (the host of rank 0's rendezvous)");
  GS_CHECK(port != nullptr, Errc::kInvalidArgument,
           "MASTER_PORT is not set (the port of rank 0's rendezvous)");
  out.masterAddr = addr;
  out.masterPort = parsePort(port, "MASTER_PORT");
  // Under torchrun its own store already listens on MASTER_PORT: use the next port.
  if (env("TORCHELASTIC_RUN_ID") != nullptr) {
    GS_CHECK(out.masterPort < 65535, Errc::kInvalidArgument,
             "MASTER_PORT=65535 leaves no port for gradstream's rendezvous under torchrun");
    ++out.masterPort;
  }
  return out;
}

std::unique_ptr<Communicator> createFromEnvironment(const Config& config) {
  const LaunchEnvironment launch = readLaunchEnvironment();
  const IpAddress address = resolveHost(launch.masterAddr, "MASTER_ADDR");
  Secret secret;
  if (!config.secret.empty()) {
    secret = deriveSecret("gs-secret:" + config.secret);
  } else {
    if (launch.rank == 0) {
      GS_LOG_WARN(
          "GS_SECRET is not set: the communicator secret is derived from MASTER_ADDR/"
          "MASTER_PORT, so anyone who can reach %s:%u can join; set GS_SECRET in the "
          "launcher's environment",
          address.toString().c_str(), launch.masterPort);
    }
    secret = deriveSecret(formatString("gs-env:%s:%u:%d", address.toString().c_str(),
                                       launch.masterPort, launch.nranks));
  }
  UniqueId id;
  if (launch.rank == 0) {
    id = startRendezvousServer(address.toString(), launch.masterPort, secret, config);
  } else {
    id.address = address;
    id.port = launch.masterPort;
    id.secret = secret;
  }
  return Communicator::create(launch.nranks, id, launch.rank, config);
}

}  // namespace gs::control
