#pragma once

// Element counts the schedule checks try for n ranks: empty, fewer elements than ranks, exactly
// as many, one more, uneven blocks, and a large count.

#include <cstddef>
#include <set>
#include <vector>

namespace gs::stream {

inline std::vector<size_t> countsFor(int n) {
  std::set<size_t> s = {0,
                        1,
                        static_cast<size_t>(n - 1),
                        static_cast<size_t>(n),
                        static_cast<size_t>(n + 1),
                        static_cast<size_t>(3 * n + 2),
                        1000};
  return {s.begin(), s.end()};
}

}  // namespace gs::stream
