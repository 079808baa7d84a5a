#include "schedules/topology.h"

#include <algorithm>
#include <map>

namespace gs::stream {

Topology Topology::fromHostNames(const std::vector<std::string>& names) {
  Topology t;
  std::map<std::string, int> index;
  for (const std::string& name : names) {
    auto [it, fresh] = index.emplace(name, static_cast<int>(index.size()));
    t.hostOf.push_back(it->second);
  }
  return t;
}

Topology Topology::blocks(int nranks, int perHost) {
  Topology t;
  for (int r = 0; r < nranks; ++r)
    t.hostOf.push_back(r / std::max(1, perHost));
  return t;
}

int Topology::hosts() const {
  int h = 0;
  for (int x : hostOf)
    h = std::max(h, x + 1);
  return h;
}

std::vector<int> Topology::ranksOn(int host) const {
  std::vector<int> out;
  for (int r = 0; r < nranks(); ++r) {
    if (hostOf[r] == host)
      out.push_back(r);
  }
  return out;
}

int Topology::localRank(int rank) const {
  int local = 0;
  for (int r = 0; r < rank; ++r)
    local += hostOf[r] == hostOf[rank] ? 1 : 0;
  return local;
}

int Topology::maxPerHost() const {
  std::vector<int> count(hosts(), 0);
  int best = 0;
  for (int h : hostOf)
    best = std::max(best, ++count[h]);
  return best;
}

bool Topology::uniform() const {
  return nranks() == 0 || maxPerHost() * hosts() == nranks();
}

int Topology::coresOn(int host) const {
  return host >= 0 && static_cast<size_t>(host) < coresOf.size() ? coresOf[host] : 0;
}

bool Topology::crowded() const {
  std::vector<int> ranks(static_cast<size_t>(hosts()), 0);
  for (int h : hostOf)
    ++ranks[h];
  for (int h = 0; h < hosts(); ++h) {
    if (coresOn(h) > 0 && ranks[h] > coresOn(h))
      return true;
  }
  return false;
}

}  // namespace gs::stream
