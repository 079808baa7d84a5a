// Writes seed inputs for the control_wire_fuzzer targets: valid encodings made by the library's
// own encoders, so that a short run (CI gives each target 10 s) starts from accepted messages
// and mutates from there instead of first having to discover magics, versions and consistent
// lengths (a result with trailing bytes went unfound for 60 s from an empty corpus). Made at
// run time rather than checked in, so they follow the formats when a version changes.
//   control_wire_seeds <corpus dir>   writes <dir>/wire_<format>_fuzzer/seed-<n>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/auth.h"
#include "control/bootstrap_wire.h"
#include "control/peer_info.h"
#include "control/unique_id.h"
#include "stream/failure_notice.h"

using namespace gs;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& dir, const std::string& target, int n, std::vector<uint8_t> bytes) {
  fs::create_directories(dir / target);
  std::ofstream out(dir / target / ("seed-" + std::to_string(n)), std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// The fuzzers read the communicator size from the first byte: 1 + byte % 64.
std::vector<uint8_t> withRanks(int nranks, std::vector<uint8_t> rest) {
  rest.insert(rest.begin(), static_cast<uint8_t>(nranks - 1));
  return rest;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const fs::path dir = argv[1];
  using namespace gs::control::wire;

  const std::string rv = "wire_rendezvous_fuzzer";
  const Nonce nonce = randomNonce();
  write(dir, rv, 0, withRanks(2, frame(MsgType::kHello, nonce)));
  write(dir, rv, 1, withRanks(2, frame(MsgType::kRegister, encodeRegistration({1, 2, {}}))));
  write(dir, rv, 2,
        withRanks(2, frame(MsgType::kStatus, encodeStatus(Errc::kInvalidArgument, "rank 3?"))));
  for (int nranks = 1; nranks <= 3; ++nranks) {
    std::vector<std::vector<uint8_t>> payloads;
    for (int r = 0; r < nranks; ++r)
      payloads.push_back(std::vector<uint8_t>(static_cast<size_t>(r * 5), 0x41));
    std::vector<std::span<const uint8_t>> views(payloads.begin(), payloads.end());
    write(dir, rv, 2 + nranks, withRanks(nranks, frame(MsgType::kResult, encodeResult(views))));
  }

  control::PeerInfo info;
  info.hostname = "node-a";
  info.pid = 4242;
  info.transport = "tcp";
  info.chunkBytes = 1 << 20;
  info.slots = 8;
  info.codec = "raw";
  info.algo = "auto";
  info.shmSmallBytes = 16 << 10;
  info.address = std::vector<uint8_t>(32, 0x11);
  info.shmAddress = std::vector<uint8_t>(16, 0x22);
  info.shmFreeBytes = 1 << 30;
  info.cpuMask = {0x03};
  transport::RemoteKey key;
  key.length = 8;
  info.slotKeys = {{0, key}, {2, key}};
  write(dir, "wire_peer_info_fuzzer", 0, info.serialize());
  write(dir, "wire_peer_info_fuzzer", 1, control::PeerInfo{}.serialize());

  std::vector<uint8_t> notice(64 + stream::kMaxNoticeCause);
  const stream::FailureNotice n{Errc::kTimeout, 1, 0, "rank 1 sent nothing for 30 s", 7};
  notice.resize(stream::encodeNotice(n, notice.data(), notice.size()));
  write(dir, "wire_failure_notice_fuzzer", 0, withRanks(4, notice));

  control::UniqueId id;
  id.address = *control::IpAddress::tryParse("127.0.0.1");
  id.port = 29500;
  id.secret = randomSecret();
  const auto bytes = id.serialize();
  std::vector<uint8_t> signedId{1};  // odd first byte: the fuzzer re-signs its mutations
  signedId.insert(signedId.end(), bytes.begin(), bytes.end());
  write(dir, "wire_unique_id_fuzzer", 0, signedId);
  return 0;
}
