#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace gs::transport::shm {

Segment::Segment(std::string name, void* data, size_t size, bool owner)
    : name_(std::move(name)), data_(data), size_(size), owner_(owner), linked_(true) {}

std::unique_ptr<Segment> Segment::create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  GS_CHECK(fd >= 0, Errc::kSystem, "shm: cannot create shared memory object %s: %s", name.c_str(),
           strerror(errno));
  void* data = MAP_FAILED;
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err == 0) {
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = errno;
  }
  close(fd);
  if (data == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw Error(Errc::kSystem,
                formatString("shm: cannot size or map %zu bytes of %s: %s (is /dev/shm large "
                             "enough? containers: --shm-size; or GS_SHM=0 to use the network)",
                             bytes, name.c_str(), strerror(err)));
  }
  return std::unique_ptr<Segment>(new Segment(name, data, bytes, true));
}

std::unique_ptr<Segment> Segment::open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0 && errno == ENOENT)
    return nullptr;
  GS_CHECK(fd >= 0, Errc::kSystem, "shm: cannot open shared memory object %s: %s", name.c_str(),
           strerror(errno));
  struct stat st {};
  void* data = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    data =
        mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  close(fd);
  if (st.st_size == 0)
    return nullptr;  // created but not sized yet: not ready
  GS_CHECK(data != MAP_FAILED, Errc::kSystem, "shm: cannot map shared memory object %s: %s",
           name.c_str(), strerror(err));
  return std::unique_ptr<Segment>(new Segment(name, data, static_cast<size_t>(st.st_size), false));
}

Segment::~Segment() {
  munmap(data_, size_);
  if (owner_)
    unlink();
}

void Segment::unlink() noexcept {
  if (linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

std::string controlSegmentName(const std::string& prefix) {
  return prefix + "-ctl";
}

std::string regionSegmentName(const std::string& prefix, uint32_t id) {
  return prefix + "-r" + std::to_string(id);
}

std::string connectionSegmentName(const std::string& dialerPrefix, int acceptorRank) {
  return dialerPrefix + "-c" + std::to_string(acceptorRank);
}

bool processGone(int pid) noexcept {
  if (pid <= 0 || pid == getpid())
    return false;
  return kill(pid, 0) != 0 && errno == ESRCH;
}

int removeStaleSegments() noexcept {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr)
    return 0;
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    // Ours are "gs-<pid>-<token>-<what>".
    int pid = 0;
    if (sscanf(entry->d_name, "gs-%d-", &pid) != 1 || !processGone(pid))
      continue;  // not ours, or its process is alive (or not ours to judge)
    if (shm_unlink((std::string("/") + entry->d_name).c_str()) == 0)
      ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace gs::transport::shm
