// Communicator::split (gs_comm_split): the parent's ranks tell each other their color and key
// over the parent itself, each color's first member (by key, then parent rank) opens a
// rendezvous on the address its own links listen on, and passes its id to the others the same
// way. The user never handles a new unique id.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/auth.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/communicator.h"

namespace gs::control {

namespace {

constexpr int32_t kNoColor = -1;  // GS_SPLIT_NOCOLOR

}  // namespace

std::vector<int32_t> Communicator::allgatherInts(std::vector<int32_t> mine) {
  std::vector<int32_t> all(mine.size() * static_cast<size_t>(nranks_));
  stream::CollectiveArgs a;
  a.kind = stream::CollectiveKind::kAllGather;
  a.send = mine.data();
  a.recv = all.data();
  a.count = mine.size();
  a.dtype = DataType::kInt32;
  run(a);
  return all;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const Config& config) {
  // Round 1: every rank's color and key. A bad color is reported by every rank, naming its
  // owner, instead of leaving the others to time out in round 2.
  const auto ck = allgatherInts({color, key});
  for (int r = 0; r < nranks_; ++r) {
    GS_CHECK(ck[2 * r] >= kNoColor, Errc::kInvalidArgument,
             "gs_comm_split: rank %d passed color %d (colors are >= 0, or GS_SPLIT_NOCOLOR)", r,
             ck[2 * r]);
  }
  // Members of this rank's color, ordered by key, then parent rank.
  std::vector<int> members;
  for (int r = 0; r < nranks_; ++r) {
    if (color != kNoColor && ck[2 * r] == color)
      members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return ck[2 * a + 1] < ck[2 * b + 1]; });
  // Round 2: each group's first member opens its rendezvous; every rank learns every leader's
  // id (a rank that leads nothing sends zeros).
  constexpr size_t kWords = UniqueId::kBytes / sizeof(int32_t);
  std::vector<int32_t> myId(kWords, 0);
  const bool leader = !members.empty() && members.front() == rank_;
  if (leader) {
    const UniqueId id = startRendezvousServer(bindAddress_, 0, randomSecret(), config);
    const auto bytes = id.serialize();
    memcpy(myId.data(), bytes.data(), bytes.size());
  }
  const auto ids = allgatherInts(std::move(myId));
  if (members.empty())
    return nullptr;
  const int newRank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::array<uint8_t, UniqueId::kBytes> bytes{};
  memcpy(bytes.data(), ids.data() + static_cast<size_t>(members.front()) * kWords, bytes.size());
  GS_LOG_INFO("rank %d: split color %d -> rank %d of %zu (rendezvous at rank %d)", rank_, color,
              newRank, members.size(), members.front());
  return create(static_cast<int>(members.size()), UniqueId::parse(bytes), newRank, config);
}

}  // namespace gs::control
