// The "receive posted" notice of point-to-point messages (stream/posted_receive.h): its 28-bit
// encoding, and which notices a sender keeps (those naming a message at or ahead of its oldest
// incomplete one, within kAccept) and drops (late ones for completed messages, bad dtypes).
#include "stream/posted_receive.h"

#include <gtest/gtest.h>

#include "stream/link.h"

namespace gs::stream {
namespace {

TEST(PostedReceive, PacksIntoTheControlPayloadAndBack) {
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (uint32_t ordinal : {0u, 1u, 1023u, 1024u, 70001u}) {
      for (uint32_t count : {0u, 1u, 8192u, PostedReceive::kMaxCount - 1}) {
        const PostedReceive p{ordinal, count, static_cast<DataType>(t)};
        const uint32_t bits = p.pack();
        ASSERT_EQ(bits & ~kPostedReceiveMask, 0u) << "spills into the tag bits";
        const PostedReceive q = PostedReceive::unpack(bits);
        EXPECT_EQ(q.ordinal, ordinal % PostedReceives::kSlots);
        EXPECT_EQ(q.count, count);
        EXPECT_EQ(q.dtype, p.dtype);
      }
    }
  }
}

TEST(PostedReceive, OnlySmallMessagesTakePart) {
  EXPECT_TRUE(PostedReceive::eligible(0, DataType::kFloat32));
  EXPECT_TRUE(PostedReceive::eligible(8192, DataType::kFloat32));  // 32 KiB
  EXPECT_FALSE(PostedReceive::eligible(8193, DataType::kFloat32));
  EXPECT_FALSE(PostedReceive::eligible(PostedReceive::kMaxCount, DataType::kUInt8));
  EXPECT_TRUE(PostedReceive::eligible(PostedReceive::kMaxCount - 1, DataType::kUInt8));
}

TEST(PostedReceives, KeepsANoticeUntilItsMessageTakesIt) {
  PostedReceives r;
  EXPECT_FALSE(r.take(5).has_value());
  r.note(PostedReceive::unpack(PostedReceive{5, 40, DataType::kInt64}.pack()), 3);
  EXPECT_FALSE(r.take(4).has_value());
  const auto p = r.take(5);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->count, 40u);
  EXPECT_EQ(p->dtype, DataType::kInt64);
  EXPECT_FALSE(r.take(5).has_value()) << "taken twice";
}

TEST(PostedReceives, ALateNoticeForACompletedMessageIsDropped) {
  PostedReceives r;
  // Messages up to 2000 completed; the notice of message 1999 arrives now (it names slot
  // 1999 % 1024 = 975, which message 2999 will use): it must not be kept for 2999.
  r.note(PostedReceive::unpack(PostedReceive{1999, 7, DataType::kFloat32}.pack()), 2000);
  EXPECT_FALSE(r.take(2999).has_value());
  EXPECT_FALSE(r.take(1999).has_value());
  // Across the wrap of the 10-bit ordinal: oldest incomplete 1020, notice for 1030 (slot 6).
  r.note(PostedReceive::unpack(PostedReceive{1030, 9, DataType::kFloat32}.pack()), 1020);
  ASSERT_TRUE(r.take(1030).has_value());
}

TEST(PostedReceives, NoticesTooFarAheadOrWithABadDtypeAreIgnored) {
  PostedReceives r;
  r.note(PostedReceive::unpack(
             PostedReceive{100 + PostedReceives::kAccept, 1, DataType::kFloat32}.pack()),
         100);
  EXPECT_FALSE(r.take(100 + PostedReceives::kAccept).has_value());
  // dtype 7 does not exist (3 bits from the network).
  const uint32_t bad = (7u << PostedReceive::kCountBits) | 3u;
  r.note(PostedReceive::unpack(bad), 0);
  EXPECT_FALSE(r.take(0).has_value());
}

TEST(PostedReceives, DropForgetsAMessageCompletedOnItsCredits) {
  PostedReceives r;
  r.note(PostedReceive::unpack(PostedReceive{2, 1, DataType::kUInt8}.pack()), 0);
  r.drop(2);
  EXPECT_FALSE(r.take(2).has_value());
}

}  // namespace
}  // namespace gs::stream
