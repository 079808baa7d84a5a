#pragma once

#include <cstdint>
#include <vector>

#include "common/types.h"
#include "schedules/schedule.h"
#include "transport/memory.h"

namespace gs::stream {

/// A condition a chunk waits for: on link `link`, at least `count` sends completed (onSend) or
/// `count` receives processed.
struct Dependency {
  uint16_t link;
  bool onSend;
  uint32_t count;
};

struct SendOp {
  uint16_t step;
  uint32_t chunkIndex;
  uint64_t elementOffset;  // within the step's segment
  uint32_t count;
  const uint8_t* source = nullptr;  // null when forwarding
  const transport::MemoryRegion* region = nullptr;
  size_t regionOffset = 0;
  uint8_t* replica = nullptr;  // this rank's copy of the data, see Step::replica
  int32_t forwardLink = -1;    // forwards recvs[forwardIndex] of that link
  uint32_t forwardIndex = 0;
  bool raw = false;  // sent in the buffer's dtype whatever the collective's codec (Step::raw)
  uint32_t depBegin = 0, depEnd = 0;
  uint64_t stepCount = 0;    // elements of the whole step (an all-to-all pair's message)
  uint64_t postedTicks = 0;  // progress: when it was posted, cycle::now() (chunk latency)
  uint32_t message = 0;      // Plan::messages entry: dtype and call of this chunk
  // Progress: left in our memory for the peer to copy (format::kChunkFlagPeerMemory), and its
  // number among such chunks on the link (Link::peerReadsPosted); done once acknowledged.
  bool peerRead = false;
  uint64_t readOrdinal = 0;
  // The receiver copies these elements out as they are (RecvAction::kCopy), so leaving them
  // in our memory for it saves a copy; a chunk it reduces gains nothing from that (see
  // copiedOutByPeer in plan.cc).
  bool peerCopies = false;
};

struct RecvOp {
  uint16_t step;
  uint32_t chunkIndex;
  uint64_t elementOffset;
  uint32_t count;
  RecvAction action;
  bool finalize;
  bool incomingFirst = false;
  bool raw = false;          // kReduceToSlot keeps the result in the buffer's dtype (Step::raw)
  uint16_t forwarded = 0;    // later sends forwarding this chunk from its slot
  int32_t forwardedOn = -1;  // the link index of the (first) such send: a reduce-to-slot is
                             // re-encoded with that link's codec
  uint8_t* dst = nullptr;
  const uint8_t* operand = nullptr;
  uint32_t depBegin = 0, depEnd = 0;
  uint64_t stepCount = 0;  // elements of the whole step (an all-to-all pair's message)
  uint32_t message = 0;    // Plan::messages entry: dtype and call of this chunk
  // Progress.
  bool processed = false;
  uint16_t forwardsDone = 0;  // forwards whose send completed; the slot is held until all did
  // Copied out of the peer's memory straight into dst (single copy): its forward sends from
  // dst, which the next rank copies out of ours in turn; the slot holds only the reference.
  bool inDst = false;
  // What the slot holds after processing (what a forward sends): codec and encoded sizes.
  uint8_t slotCodec = 0;
  uint32_t slotMetaBytes = 0;
  uint32_t slotPayloadBytes = 0;
};

/// The chunk-level program of one collective on one rank: per link an ordered send queue and
/// an ordered receive queue, group-major (chunks [0, G) of every step, then [G, 2G) of every
/// step, ...) so a rank never fills its neighbour's slots with chunks of one step while the
/// neighbour waits to forward those of the previous one; with the dependencies that make in-place
/// and pipelined execution safe (a chunk reads memory only after the chunks writing it landed, and
/// overwrites memory only after the chunks reading it left). Built once per call, outside the data
/// path.
/// How the elements of a chunk are typed and which call the chunk belongs to. A collective's
/// chunks all share the call's (one entry, its id unused: the run's collective id); each
/// point-to-point message has its own dtype and its number on its pair and direction, which
/// its chunk headers carry as their collectiveId.
struct PlanMessage {
  DataType dtype = DataType::kFloat32;
  uint32_t elementSize = 4;
  uint32_t id = 0;
};

struct Plan {
  struct LinkQueues {
    int peer;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
  };
  std::vector<LinkQueues> links;
  std::vector<Dependency> deps;
  std::vector<PlanMessage> messages;
};

/// Where the schedule's buffers are and how chunks are cut.
struct PlanInput {
  const Schedule* schedule;
  const uint8_t* send;
  uint8_t* recv;
  const transport::MemoryRegion* sendRegion;
  const transport::MemoryRegion* recvRegion;
  size_t elementSize;
  size_t chunkElements;
  /// Chunks of one step sent back to back before the next step's chunks of the same group
  /// (NCCL's slices per chunk). Half the receive slots: a receiver holding a group for
  /// forwarding still has room for the next group, which keeps the ring deadlock-free.
  size_t groupChunks;
};

/// Builds a collective's plan (one PlanMessage, of elementSize; the caller sets its dtype).
Plan buildPlan(const PlanInput& input);

/// One point-to-point message, as appendMessage cuts it.
struct MessageInput {
  bool send = true;
  uint8_t* buffer = nullptr;                        // read for a send, written for a receive
  const transport::MemoryRegion* region = nullptr;  // a send's buffer, registered
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  uint32_t id = 0;  // PlanMessage::id
  size_t chunkElements = 1;
  bool raw = false;  // travels in its dtype whatever the codec (one the codec does not support)
};
/// Appends a message's chunks at the end of q's sends or receives, whole and in order (the
/// receiver cuts its receive alike: both ends' queues match chunk for chunk whatever else
/// each posted), and its PlanMessage to plan.messages. A message of no elements is one
/// header-only chunk, so an end that expected elements finds out. No dependencies: the
/// buffers of messages in flight must not overlap (as for MPI's and NCCL's requests).
void appendMessage(Plan& plan, Plan::LinkQueues& q, const MessageInput& m);

}  // namespace gs::stream
