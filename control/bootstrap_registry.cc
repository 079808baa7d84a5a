// createUniqueId / startRendezvousServer / shutdownRendezvousServers: the rendezvous servers of
// gs_get_unique_id and of the environment launch, kept in one process-global registry.

#include <algorithm>
#include <iterator>
#include <memory>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "control/bootstrap.h"
#include "control/net.h"

namespace gs::control {
namespace {

// Servers started for gs_get_unique_id / env launch outlive the call that made them. The
// registry owns them; its destructor (at exit) stops and joins each thread before the statics
// those threads use are gone.
class ServerRegistry {
 public:
  ~ServerRegistry() { shutdown(); }

  void add(std::unique_ptr<RendezvousServer> server) {
    std::vector<std::unique_ptr<RendezvousServer>> finished;
    std::lock_guard<std::mutex> lock(mutex_);
    auto done = std::partition(servers_.begin(), servers_.end(),
                               [](const auto& s) { return !s->finished(); });
    std::move(done, servers_.end(), std::back_inserter(finished));
    servers_.erase(done, servers_.end());
    servers_.push_back(std::move(server));
  }

  void shutdown() {
    std::vector<std::unique_ptr<RendezvousServer>> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      all.swap(servers_);
    }
    all.clear();  // joins outside the lock
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<RendezvousServer>> servers_;
};

ServerRegistry& registry() {
  static ServerRegistry instance;
  return instance;
}

}  // namespace

UniqueId startRendezvousServer(const std::string& address,
                               uint16_t port,
                               const Secret& secret,
                               const Config& config) {
  auto server = std::make_unique<RendezvousServer>(address, port, secret, config);
  UniqueId id = server->uniqueId();
  registry().add(std::move(server));
  return id;
}

UniqueId createUniqueId(const Config& config) {
  std::string address;
  if (config.socketIfname.empty()) {
    static std::once_flag once;
    std::call_once(once, [] {
      GS_LOG_INFO(
          "GS_SOCKET_IFNAME is unset: the rendezvous listens on 127.0.0.1 only, so only "
          "ranks on this host can join and nothing is exposed to the network");
    });
    address = "127.0.0.1";
  } else {
    address = interfaceAddress(config.socketIfname);
  }
  return startRendezvousServer(address, 0, randomSecret(), config);
}

void shutdownRendezvousServers() {
  registry().shutdown();
}

}  // namespace gs::control
