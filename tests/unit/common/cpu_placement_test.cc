// Placement of a rank's polling thread where ranks outnumber cores (common/cpu_placement.h):
// the CPU chosen, and that the thread keeps (gets back) the affinity mask it had.
#include "common/cpu_placement.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace gs {
namespace {

cpu_set_t maskOf(std::initializer_list<int> cpus) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c : cpus)
    CPU_SET(c, &s);
  return s;
}

cpu_set_t currentMask() {
  cpu_set_t s;
  CPU_ZERO(&s);
  EXPECT_EQ(sched_getaffinity(0, sizeof(s), &s), 0);
  return s;
}

TEST(CpuPlacement, TheSlotCountsOnlyTheCpusAllowedAndWrapsAround) {
  const cpu_set_t allowed = maskOf({1, 3, 6});
  EXPECT_EQ(nthAllowedCpu(allowed, 0), 1);
  EXPECT_EQ(nthAllowedCpu(allowed, 1), 3);
  EXPECT_EQ(nthAllowedCpu(allowed, 2), 6);
  EXPECT_EQ(nthAllowedCpu(allowed, 3), 1);
  EXPECT_EQ(nthAllowedCpu(allowed, 7), 3);
  EXPECT_EQ(nthAllowedCpu(maskOf({}), 0), -1);
  EXPECT_EQ(nthAllowedCpu(allowed, -1), -1);
}

// Run in a thread of its own: the test changes the calling thread's affinity.
TEST(CpuPlacement, APlacedThreadGetsItsWholeMaskBack) {
  std::thread([] {
    const cpu_set_t before = currentMask();
    const int count = CPU_COUNT(&before);
    const int cpu = placeCallingThread(1);
    const cpu_set_t after = currentMask();
    EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the thread's affinity changed";
    if (count < 2) {
      EXPECT_EQ(cpu, -1) << "one CPU allowed: nothing to place";
      return;
    }
    EXPECT_EQ(cpu, nthAllowedCpu(before, 1));
    EXPECT_EQ(cpu, homeCpuOfCallingThread(1));
    EXPECT_TRUE(CPU_ISSET(cpu, &before));
  }).join();
}

TEST(CpuPlacement, AThreadPinnedToOneCpuIsLeftWhereItIs) {
  std::thread([] {
    const cpu_set_t all = currentMask();
    const cpu_set_t one = maskOf({nthAllowedCpu(all, 0)});
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_EQ(homeCpuOfCallingThread(1), -1);
    EXPECT_EQ(placeCallingThread(1), -1);
    const cpu_set_t after = currentMask();
    EXPECT_TRUE(CPU_EQUAL(&one, &after)) << "a launcher's pinning was undone";
  }).join();
}

// What a rank tells the others of its CPUs, and the cores a host's ranks share: all of them
// where every rank may use every CPU, each one's own where a launcher pinned them.
TEST(CpuPlacement, TheMaskMatchesTheAffinityAndTheUnionCountsSharedCpusOnce) {
  const cpu_set_t mine = currentMask();
  const std::vector<uint8_t> bytes = callingThreadCpuMask();
  ASSERT_FALSE(bytes.empty());
  EXPECT_NE(bytes.back(), 0) << "trailing zero bytes are dropped";
  int set = 0;
  for (int cpu = 0; cpu < static_cast<int>(bytes.size()) * 8; ++cpu) {
    const bool inBytes = (bytes[cpu / 8] >> (cpu % 8)) & 1;
    EXPECT_EQ(inBytes, CPU_ISSET(cpu, &mine) != 0) << "cpu " << cpu;
    set += inBytes ? 1 : 0;
  }
  EXPECT_EQ(set, CPU_COUNT(&mine));

  const std::vector<std::vector<uint8_t>> shared = {{0x03}, {0x03}, {0x03}};
  EXPECT_EQ(cpusInUnion(shared), 2);
  const std::vector<std::vector<uint8_t>> pinned = {{0x01}, {0x02}, {0x04}, {0x00, 0x01}};
  EXPECT_EQ(cpusInUnion(pinned), 4);
  EXPECT_EQ(cpusInUnion(std::vector<std::vector<uint8_t>>{}), 0);

  // Pinned to one CPU, the thread says so.
  std::thread([&] {
    const cpu_set_t one = maskOf({nthAllowedCpu(mine, 0)});
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    const std::vector<std::vector<uint8_t>> alone = {callingThreadCpuMask()};
    EXPECT_EQ(cpusInUnion(alone), 1);
  }).join();
}

}  // namespace
}  // namespace gs
