// Placement of a rank's polling thread where ranks outnumber cores (common/cpu_placement.h):
// the CPU chosen, and that the thread keeps (gets back) the affinity mask it had.
#include "common/cpu_placement.h"

#include <thread>

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

}  // namespace
}  // namespace gs
