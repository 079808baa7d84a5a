// Communicator::split (gs_comm_split): the parent's ranks tell each other their color, key and
// a fresh secret over the parent itself; each color's members open their devices with their
// first member's secret and all-gather their records over the parent too, in place of a
// rendezvous server. The user never handles a new unique id.
#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/communicator.h"
#include "control/peer_info.h"

namespace gs::control {

namespace {

constexpr int32_t kNoColor = -1;  // GS_SPLIT_NOCOLOR
// Round 2's length of a member that could not open its devices (or whose settings were
// refused): the others fail naming it instead of building a communicator it will not be in.
constexpr int32_t kJoinFailed = -1;
constexpr size_t kSecretWords = sizeof(Secret) / sizeof(int32_t);
constexpr size_t kRound1Words = 2 + kSecretWords;  // color, key, secret

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

std::vector<std::vector<uint8_t>> Communicator::allgatherPadded(
    std::span<const uint8_t> mine, const std::vector<int32_t>& lengths) {
  size_t longest = 0;
  for (int r = 0; r < nranks_; ++r) {
    GS_CHECK(lengths[r] >= 0 && static_cast<size_t>(lengths[r]) <= kMaxRendezvousPayload,
             Errc::kRemote, "rank %d announced a record of %d bytes (at most %zu)", r, lengths[r],
             kMaxRendezvousPayload);
    longest = std::max(longest, static_cast<size_t>(lengths[r]));
  }
  std::vector<uint8_t> padded(longest, 0), all(longest * static_cast<size_t>(nranks_));
  if (!mine.empty())
    memcpy(padded.data(), mine.data(), mine.size());
  if (longest > 0) {
    stream::CollectiveArgs a;
    a.kind = stream::CollectiveKind::kAllGather;
    a.send = padded.data();
    a.recv = all.data();
    a.count = longest;
    a.dtype = DataType::kUInt8;
    run(a);
  }
  std::vector<std::vector<uint8_t>> out(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    const uint8_t* p = all.data() + static_cast<size_t>(r) * longest;
    out[r].assign(p, p + lengths[r]);
  }
  return out;
}

std::unique_ptr<Communicator> Communicator::split(int color,
                                                  int key,
                                                  const std::function<Config()>& config) {
  // Round 1: every rank's color, key and a secret of its own (the group uses its first
  // member's). A bad color is reported by every rank, naming its owner.
  const Secret offered = randomSecret();
  std::vector<int32_t> round1(kRound1Words);
  round1[0] = color;
  round1[1] = key;
  memcpy(round1.data() + 2, offered.data(), sizeof(offered));
  const auto all = allgatherInts(std::move(round1));
  const auto colorOf = [&](int r) { return all[r * kRound1Words]; };
  const auto keyOf = [&](int r) { return all[r * kRound1Words + 1]; };
  for (int r = 0; r < nranks_; ++r) {
    GS_CHECK(colorOf(r) >= kNoColor, Errc::kInvalidArgument,
             "gs_comm_split: rank %d passed color %d (colors are >= 0, or GS_SPLIT_NOCOLOR)", r,
             colorOf(r));
  }
  // Members of this rank's color, ordered by key, then parent rank.
  std::vector<int> members;
  for (int r = 0; r < nranks_; ++r) {
    if (color != kNoColor && colorOf(r) == color)
      members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return keyOf(a) < keyOf(b); });

  // Round 2: members open their devices and publish their records (non-members publish
  // nothing); one allgather over the parent serves every group at once.
  std::unique_ptr<Communicator> child;
  std::exception_ptr failed;
  std::vector<uint8_t> record;
  PeerInfo mine;
  if (!members.empty()) {
    const int newRank =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    Secret secret;
    memcpy(secret.data(), all.data() + members.front() * kRound1Words + 2, sizeof(secret));
    try {
      child = unconnected(static_cast<int>(members.size()), newRank, config());
      child->openDevices(secret, bindAddress_);
      mine = child->ownRecord();
      record = mine.serialize();
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // Every rank takes part in both rounds whatever happened, or the others would wait for it.
  auto lengths = allgatherInts({failed ? kJoinFailed : static_cast<int32_t>(record.size())});
  int failedMember = -1;
  for (int m : members)
    failedMember = failedMember < 0 && m != rank_ && lengths[m] == kJoinFailed ? m : failedMember;
  for (int32_t& l : lengths)
    l = l == kJoinFailed ? 0 : l;
  const auto records = allgatherPadded(record, lengths);
  if (failed)
    std::rethrow_exception(failed);
  GS_CHECK(failedMember < 0, Errc::kRemote,
           "gs_comm_split: rank %d could not join the new communicator (its own error says why)",
           failedMember);
  if (members.empty())
    return nullptr;
  GS_LOG_INFO("rank %d: split color %d -> rank %d of %zu", rank_, color, child->rank_,
              members.size());
  std::vector<std::vector<uint8_t>> theirs;
  std::string ranksHere;  // the new ranks in this communicator's numbering, for messages
  for (size_t i = 0; i < members.size(); ++i) {
    theirs.push_back(records[members[i]]);
    ranksHere += formatString("%s%d", i == 0 ? "" : ", ", members[i]);
  }
  std::vector<PeerInfo> infos;
  try {
    infos = parseRecords(theirs, mine, child->rank_);
  } catch (const Error& e) {
    throw Error(e.code(), formatString("gs_comm_split: %s (the new ranks 0..%zu are ranks %s of "
                                       "the communicator split)",
                                       e.what(), members.size() - 1, ranksHere.c_str()));
  }
  child->join(Deadline::afterMs(child->config_.timeoutMs), infos, Links::kAtFirstUse);
  return child;
}

}  // namespace gs::control
