#include "control/peer_links.h"

#include <cstring>
#include <map>

#include "common/error.h"
#include "common/log.h"

namespace gs::control {
namespace {

// What two linked ranks swap over a fresh connection: the key of the receiver's slots.
// Layout: magic (4 bytes), the RemoteKey (fixed size, trivially copyable).
constexpr uint32_t kSlotKeyMagic = 0x4b534753;  // "GSSK"
struct SlotKeyMessage {
  uint32_t magic = 0;
  transport::RemoteKey key;
};

}  // namespace

std::vector<stream::Algorithm> allowedAlgorithms(const std::string& setting,
                                                 const stream::Topology& topology) {
  std::vector<stream::Algorithm> out;
  if (setting == "auto") {
    // Every schedule the topology can run; hierarchical only across several hosts with the
    // same number of ranks each (on one host it is the ring with extra steps).
    for (stream::Algorithm a : stream::kAlgorithms) {
      if (a != stream::Algorithm::kHierarchical || (topology.hosts() > 1 && topology.uniform()))
        out.push_back(a);
    }
    return out;
  }
  stream::Algorithm a;
  GS_CHECK(stream::parseAlgorithm(setting, &a), Errc::kInvalidArgument,
           "GS_ALGO='%s' is unknown (auto, ring, tree, halving_doubling, hierarchical, "
           "recursive_doubling)",
           setting.c_str());
  out.push_back(a);
  return out;
}

std::set<int> schedulePeers(int rank,
                            const stream::Topology& topology,
                            const std::vector<stream::Algorithm>& algorithms) {
  const int n = topology.nranks();
  std::set<int> peers;
  if (n <= 1)
    return peers;
  peers.insert((rank + 1) % n);
  peers.insert((rank + n - 1) % n);
  // Enough elements that no block of any schedule is empty (the peer set does not depend on
  // the count otherwise).
  const size_t count = 4 * static_cast<size_t>(n) * static_cast<size_t>(n > 64 ? 1 : n);
  for (stream::Algorithm a : algorithms) {
    if (a == stream::Algorithm::kRing)
      continue;
    const stream::Schedule s = stream::buildAllReduce(a, rank, topology, count);
    for (const stream::Step& st : s.steps) {
      if (st.sendPeer >= 0)
        peers.insert(st.sendPeer);
      if (st.recvPeer >= 0)
        peers.insert(st.recvPeer);
    }
  }
  return peers;
}

std::vector<std::unique_ptr<stream::Link>> connectPeerLinks(int nranks,
                                                            const std::vector<PeerEndpoint>& peers,
                                                            const stream::SlotLayout& layout,
                                                            Deadline deadline) {
  std::vector<std::unique_ptr<stream::Link>> links(nranks);
  std::vector<std::unique_ptr<transport::Connection>> connections(nranks);
  for (const PeerEndpoint& e : peers)
    connections[e.peer] = e.device->connect(e.peer, e.address, deadline);
  for (const PeerEndpoint& e : peers)
    links[e.peer] = std::make_unique<stream::Link>(e.peer, *e.device, layout);

  // Messages live in one array per device registration; two per peer (out, in).
  std::vector<SlotKeyMessage> messages(2 * static_cast<size_t>(nranks));
  std::map<transport::Device*, std::unique_ptr<transport::MemoryRegion>> regions;
  for (const PeerEndpoint& e : peers) {
    if (!regions.count(e.device)) {
      regions[e.device] =
          e.device->registerMemory(messages.data(), messages.size() * sizeof(SlotKeyMessage));
    }
  }
  std::vector<int> pending;  // per peer: 2 completions (send, recv) outstanding
  std::vector<int> left(nranks, 0);
  std::vector<std::vector<transport::Completion>> earlyByPeer(nranks);
  for (const PeerEndpoint& e : peers) {
    const size_t out = 2 * static_cast<size_t>(e.peer), in = out + 1;
    messages[out].magic = kSlotKeyMagic;
    messages[out].key = links[e.peer]->recvSlotsKey();
    const transport::MemoryRegion* region = regions[e.device].get();
    transport::Connection& c = *connections[e.peer];
    const bool posted = c.postRecv({region, in * sizeof(SlotKeyMessage), sizeof(SlotKeyMessage)},
                                   in) == transport::PostResult::kOk &&
                        c.postSend({region, out * sizeof(SlotKeyMessage), sizeof(SlotKeyMessage)},
                                   out) == transport::PostResult::kOk;
    GS_CHECK(posted, Errc::kRemote, "connection to rank %d failed while exchanging slot keys: %s",
             e.peer, c.errorMessage().c_str());
    left[e.peer] = 2;
    pending.push_back(e.peer);
  }
  transport::Completion done[16];
  while (!pending.empty()) {
    bool any = false;
    for (size_t i = 0; i < pending.size();) {
      const int p = pending[i];
      transport::Connection& c = *connections[p];
      const size_t n = c.poll(done);
      bool failed = false;
      for (size_t k = 0; k < n; ++k) {
        if (done[k].kind == transport::CompletionKind::kError || done[k].status != Errc::kOk) {
          // The peer may have our key and its own sent, then failed in its first collective
          // (and closed) while we were still here: the engine reports that, with the abort
          // notices that came with it, at our first collective. Without its key, init fails.
          earlyByPeer[p].push_back(done[k]);
          failed = true;
          continue;
        }
        if (done[k].kind == transport::CompletionKind::kRecv) {
          const SlotKeyMessage& m = messages[2 * static_cast<size_t>(p) + 1];
          GS_CHECK(done[k].length == sizeof(SlotKeyMessage) && m.magic == kSlotKeyMagic &&
                       m.key.length <= transport::RemoteKey::kMaxBytes,
                   Errc::kRemote, "rank %d sent a malformed slot key (%u bytes)", p,
                   done[k].length);
          --left[p];
        } else if (done[k].kind == transport::CompletionKind::kSend) {
          --left[p];
        } else if (done[k].kind == transport::CompletionKind::kRemoteWrite) {
          // The peer has our key already and started a collective: keep it for the engine.
          earlyByPeer[p].push_back(done[k]);
        }
      }
      any |= n > 0;
      GS_CHECK(!failed || left[p] == 0, Errc::kRemote,
               "connection to rank %d failed while exchanging slot keys: %s", p,
               c.errorMessage().c_str());
      if (left[p] == 0) {
        links[p]->attach(std::move(connections[p]), messages[2 * static_cast<size_t>(p) + 1].key);
        links[p]->earlyCompletions = std::move(earlyByPeer[p]);
        pending[i] = pending.back();
        pending.pop_back();
      } else {
        ++i;
      }
    }
    if (!pending.empty() && !any) {
      GS_CHECK(!deadline.expired(), Errc::kTimeout,
               "rank %d did not send its slot key in time (timeout)", pending.front());
      for (const PeerEndpoint& e : peers) {
        if (e.peer == pending.front())
          e.device->waitForActivity(std::chrono::microseconds(1000));
      }
    }
  }
  return links;
}

}  // namespace gs::control
