#pragma once

// RAII owners of libibverbs objects. Each is a unique_ptr whose deleter calls the matching
// ibv_destroy_* / ibv_dealloc_pd / ibv_dereg_mr / ibv_close_device and reports a failure from
// its return value: those calls return the error number (0 on success) instead of setting
// errno. Owners declared in acquisition order are destroyed in reverse order (QPs before the CQ
// they use, the completion channel before the PD before the device context), as rdma-core's
// own tools tear down.
#include <memory>

#include <infiniband/verbs.h>

namespace gs::transport::verbs {

/// Logs "verbs: <call> failed: <reason>" when rc is not 0 (rc: the call's return value; a
/// provider that returns -1 leaves the reason in errno).
void reportTeardown(int rc, const char* call) noexcept;

struct VerbsDeleter {
  void operator()(ibv_context* p) const noexcept {
    reportTeardown(ibv_close_device(p), "ibv_close_device");
  }
  void operator()(ibv_pd* p) const noexcept { reportTeardown(ibv_dealloc_pd(p), "ibv_dealloc_pd"); }
  void operator()(ibv_comp_channel* p) const noexcept {
    reportTeardown(ibv_destroy_comp_channel(p), "ibv_destroy_comp_channel");
  }
  void operator()(ibv_cq* p) const noexcept { reportTeardown(ibv_destroy_cq(p), "ibv_destroy_cq"); }
  void operator()(ibv_qp* p) const noexcept { reportTeardown(ibv_destroy_qp(p), "ibv_destroy_qp"); }
  void operator()(ibv_mr* p) const noexcept { reportTeardown(ibv_dereg_mr(p), "ibv_dereg_mr"); }
};

template <class T>
using VerbsPtr = std::unique_ptr<T, VerbsDeleter>;

}  // namespace gs::transport::verbs
