#include "transport/verbs/hw_counters.h"

#include <cstdio>
#include <initializer_list>

namespace gs::transport::verbs {
namespace {

// Adds the counter in dir/name to *sum; false when the file does not exist or does not parse.
bool addCounter(const std::string& dir, const char* name, uint64_t* sum) {
  FILE* f = fopen((dir + "/" + name).c_str(), "r");
  if (f == nullptr)
    return false;
  unsigned long long value = 0;
  const bool ok = fscanf(f, "%llu", &value) == 1;
  fclose(f);
  if (ok)
    *sum += value;
  return ok;
}

bool addCounters(const std::string& dir, std::initializer_list<const char*> names, uint64_t* sum) {
  bool any = false;
  for (const char* name : names)
    any |= addCounter(dir, name, sum);
  return any;
}

}  // namespace

PortCounters::PortCounters(const std::string& device,
                           int port,
                           std::string sysfsRoot,
                           std::chrono::milliseconds refresh)
    : dir_(sysfsRoot + "/class/infiniband/" + device + "/ports/" + std::to_string(port) +
           "/hw_counters"),
      refresh_(refresh) {}

bool PortCounters::read(LinkInfo* out) {
  const auto now = Clock::now();
  if (last_ == Clock::time_point{} || now - last_ >= refresh_) {
    last_ = now;
    LinkInfo fresh;
    bool any = addCounters(dir_, {"np_ecn_marked_roce_packets"}, &fresh.ecnMarked);
    any |= addCounters(dir_, {"rp_cnp_handled"}, &fresh.cnpReceived);
    // mlx5: requester timeouts and sequence errors (each a go-back-N retransmission);
    // rxe: retries by its completer.
    any |= addCounters(dir_, {"local_ack_timeout_err", "packet_seq_err", "completer_retry_err"},
                       &fresh.retransmits);
    any_ = any;
    cached_ = fresh;
  }
  if (!any_)
    return false;
  out->ecnMarked = cached_.ecnMarked;
  out->cnpReceived = cached_.cnpReceived;
  out->retransmits = cached_.retransmits;
  return true;
}

}  // namespace gs::transport::verbs
