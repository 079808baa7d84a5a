#include "common/cpu_placement.h"

namespace gs {

namespace {
// The calling thread's affinity mask, when it leaves a choice (two CPUs or more).
bool choiceOfCpus(cpu_set_t* allowed) {
  CPU_ZERO(allowed);
  return sched_getaffinity(0, sizeof(*allowed), allowed) == 0 && CPU_COUNT(allowed) > 1;
}
}  // namespace

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
