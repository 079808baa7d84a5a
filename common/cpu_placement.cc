#include "common/cpu_placement.h"

namespace gs {

namespace {
// The calling thread's affinity mask, when it leaves a choice (two CPUs or more).
bool choiceOfCpus(cpu_set_t* allowed) {
  CPU_ZERO(allowed);
  return sched_getaffinity(0, sizeof(*allowed), allowed) == 0 && CPU_COUNT(allowed) > 1;
}
}  // namespace

std::vector<uint8_t> callingThreadCpuMask() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
    return {};
  std::vector<uint8_t> mask;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed))
      continue;
    mask.resize(static_cast<size_t>(cpu / 8 + 1), 0);
    mask[cpu / 8] |= static_cast<uint8_t>(1u << (cpu % 8));
  }
  return mask;
}

int cpusInUnion(std::span<const std::vector<uint8_t>> masks) {
  std::vector<uint8_t> all;
  for (const std::vector<uint8_t>& m : masks) {
    if (m.size() > all.size())
      all.resize(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i)
      all[i] |= m[i];
  }
  int count = 0;
  for (uint8_t b : all)
    count += __builtin_popcount(b);
  return count;
}

int nthAllowedCpu(const cpu_set_t& allowed, int slot) {
  const int count = CPU_COUNT(&allowed);
  if (count == 0 || slot < 0)
    return -1;
  int want = slot % count;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && want-- == 0)
      return cpu;
  }
  return -1;
}

int homeCpuOfCallingThread(int slot) {
  cpu_set_t allowed;
  return choiceOfCpus(&allowed) ? nthAllowedCpu(allowed, slot) : -1;
}

int placeCallingThread(int slot) {
  cpu_set_t allowed;
  if (!choiceOfCpus(&allowed))
    return -1;
  const int cpu = nthAllowedCpu(allowed, slot);
  if (cpu < 0)
    return -1;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  // Setting a one-CPU mask migrates the thread before the call returns; the second call only
  // widens the mask again, which moves nothing.
  if (sched_setaffinity(0, sizeof(one), &one) != 0)
    return -1;
  if (sched_setaffinity(0, sizeof(allowed), &allowed) == 0)
    return cpu;
  // The CPUs allowed changed meanwhile (a cpuset rewritten): every CPU, which the kernel
  // narrows to those the cpuset allows now.
  cpu_set_t any;
  CPU_ZERO(&any);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    CPU_SET(c, &any);
  return sched_setaffinity(0, sizeof(any), &any) == 0 ? cpu : -2;
}

}  // namespace gs
