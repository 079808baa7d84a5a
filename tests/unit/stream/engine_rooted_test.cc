// Reduce and all-to-all through the engine over real loopback connections between every pair
// of ranks (threads): results element for element against the definitions, for both reduce
// algorithms, every root, counts of 0, 1 and several chunks, uneven all-to-all layouts with
// empty pairs, a lossy codec, and mismatched all-to-all counts reported on both ends.
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codecs/codec.h"
#include "stream/engine.h"
#include "tests/unit/stream/ring_cluster.h"

namespace gs::stream {
namespace {

float inputOf(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 10 + static_cast<int>(i % 53));
}

// Runs body(rank, engine) on every rank's thread; returns each rank's error text ("" if none).
std::vector<std::string> onEveryRank(RingCluster& cluster,
                                     const std::function<void(int, Engine&)>& body) {
  const int n = static_cast<int>(cluster.ranks.size());
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, *cluster.ranks[r].engine);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

RingCluster everyPair(int n, int64_t timeoutMs = 5000) {
  return RingCluster(n, testConfig(timeoutMs), 1, nullptr, 0, true);
}

TEST(EngineReduce, BothAlgorithmsEveryRootAndCount) {
  for (int n : {1, 2, 3, 5}) {
    RingCluster cluster = everyPair(n);
    for (ReduceAlgorithm algo : {ReduceAlgorithm::kChain, ReduceAlgorithm::kTree}) {
      for (int root = 0; root < n; ++root) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{5003}}) {
          std::vector<std::vector<float>> out(n, std::vector<float>(count, -1.f));
          const auto errors = onEveryRank(cluster, [&](int r, Engine& engine) {
            std::vector<float> in(count), scratch(count);
            for (size_t i = 0; i < count; ++i)
              in[i] = inputOf(r, i);
            CollectiveArgs a;
            a.kind = CollectiveKind::kReduce;
            a.reduceAlgorithm = algo;
            a.root = root;
            a.send = in.data();
            a.recv = r == root ? out[r].data() : scratch.data();
            a.count = count;
            engine.run(a);
          });
          const std::string what = std::string(reduceAlgorithmName(algo)) +
                                   " N=" + std::to_string(n) + " root " + std::to_string(root) +
                                   " count " + std::to_string(count);
          for (int r = 0; r < n; ++r)
            ASSERT_EQ(errors[r], "") << what << " rank " << r;
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int q = 0; q < n; ++q)
              want += inputOf(q, i);  // small integers: exact in any order
            ASSERT_EQ(out[root][i], want) << what << " i=" << i;
          }
          for (int r = 0; r < n; ++r) {
            if (r != root && count > 0) {
              EXPECT_EQ(out[r][0], -1.f) << what << ": rank " << r << "'s buffer written";
            }
          }
        }
      }
    }
  }
}

// Rank r sends counts[r][j] elements to rank j; blocks placed in a shuffled order with gaps.
struct Layouts {
  std::vector<AllToAllLayout> of;
  static Layouts random(int n, std::mt19937& rng, size_t maxCount) {
    Layouts l;
    l.of.resize(n);
    std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
    for (auto& row : counts) {
      for (auto& c : row)
        c = rng() % 4 == 0 ? 0 : rng() % (maxCount + 1);
    }
    auto place = [&](const std::vector<size_t>& sizes, std::vector<size_t>* displs) {
      std::vector<int> order(n);
      for (int j = 0; j < n; ++j)
        order[j] = j;
      std::shuffle(order.begin(), order.end(), rng);
      displs->assign(n, 0);
      size_t at = 0;
      for (int j : order) {
        at += rng() % 2;
        (*displs)[j] = at;
        at += sizes[j];
      }
    };
    for (int r = 0; r < n; ++r) {
      l.of[r].sendCounts = counts[r];
      for (int i = 0; i < n; ++i)
        l.of[r].recvCounts.push_back(counts[i][r]);
      place(l.of[r].sendCounts, &l.of[r].sendDispls);
      place(l.of[r].recvCounts, &l.of[r].recvDispls);
    }
    return l;
  }
};

void expectAllToAll(RingCluster& cluster, const Layouts& l, const codecs::Codec* codec) {
  const int n = static_cast<int>(cluster.ranks.size());
  std::vector<std::vector<float>> out(n);
  const auto errors = onEveryRank(cluster, [&](int r, Engine& engine) {
    const AllToAllLayout& mine = l.of[r];
    std::vector<float> in(mine.sendExtent(), -2.f);
    for (int j = 0; j < n; ++j) {
      for (size_t t = 0; t < mine.sendCounts[j]; ++t)
        in[mine.sendDispls[j] + t] = inputOf(r, 1000 * j + t);
    }
    out[r].assign(mine.recvExtent(), -1.f);
    CollectiveArgs a;
    a.kind = CollectiveKind::kAllToAll;
    a.send = in.data();
    a.recv = out[r].data();
    a.layout = std::make_shared<const AllToAllLayout>(mine);
    a.codec = codec;
    engine.run(a);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "N=" << n << " rank " << r;
    const AllToAllLayout& mine = l.of[r];
    std::vector<bool> block(out[r].size(), false);
    for (int i = 0; i < n; ++i) {
      for (size_t t = 0; t < mine.recvCounts[i]; ++t) {
        block[mine.recvDispls[i] + t] = true;
        // bf16 keeps these small integers exactly (<= 8 significant bits).
        ASSERT_EQ(out[r][mine.recvDispls[i] + t], inputOf(i, 1000 * r + t))
            << "N=" << n << " rank " << r << " from " << i << " t=" << t;
      }
    }
    for (size_t at = 0; at < block.size(); ++at) {
      if (!block[at]) {
        ASSERT_EQ(out[r][at], -1.f) << "rank " << r << " gap " << at << " written";
      }
    }
  }
}

TEST(EngineAllToAll, UniformCountsForEveryN) {
  for (int n : {1, 2, 3, 4, 6}) {
    RingCluster cluster = everyPair(n);
    for (size_t count : {size_t{0}, size_t{1}, size_t{3001}}) {
      Layouts l;
      l.of.assign(n, AllToAllLayout::uniform(n, count));
      expectAllToAll(cluster, l, nullptr);
    }
  }
}

TEST(EngineAllToAll, UnevenLayoutsWithEmptyPairsRawAndBf16) {
  std::mt19937 rng(7);
  const auto bf16 = codecs::makeCodec(codecs::CodecSpec::parse("bf16"));
  for (int n : {2, 3, 5}) {
    RingCluster cluster = everyPair(n);
    for (int trial = 0; trial < 4; ++trial)
      expectAllToAll(cluster, Layouts::random(n, rng, 2500), trial % 2 ? bf16.get() : nullptr);
  }
}

// The receiving end finds it; a rank that already finished its part (the sender, here) returns
// before the notice can reach it, as a broadcast root does (it fails at its next call); every
// rank that fails reports the same cause.
TEST(EngineAllToAll, APairThatDisagreesOnItsCountFailsNamingBothCounts) {
  const int n = 3;
  RingCluster cluster = everyPair(n, 2000);
  Layouts l;
  l.of.assign(n, AllToAllLayout::uniform(n, 8));
  l.of[2].sendCounts[0] = 0;  // rank 2 sends nothing to rank 0, which expects 8
  l.of[2].sendDispls = {0, 0, 8};
  const auto errors = onEveryRank(cluster, [&](int r, Engine& engine) {
    std::vector<float> in(l.of[r].sendExtent() + 8), out(l.of[r].recvExtent());
    CollectiveArgs a;
    a.kind = CollectiveKind::kAllToAll;
    a.send = in.data();
    a.recv = out.data();
    a.layout = std::make_shared<const AllToAllLayout>(l.of[r]);
    engine.run(a);
  });
  const std::string cause =
      "all-to-all counts differ between ranks: rank 2 sends 0 elements to rank 0, which expects "
      "8 from it";
  EXPECT_NE(errors[0].find(cause), std::string::npos) << errors[0];
  for (int r = 1; r < n; ++r) {
    if (!errors[r].empty()) {
      EXPECT_NE(errors[r].find(cause), std::string::npos) << "rank " << r << ": " << errors[r];
    }
  }
}

}  // namespace
}  // namespace gs::stream
