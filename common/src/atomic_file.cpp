// AtomicFileWriter: a temporary file beside the final one, renamed over it
// only once every byte is written, fsync'ed and the close succeeded.
#include "backplane_common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

namespace backplane::common {

namespace {

namespace fs = std::filesystem;

// The longest part of the final name kept in the temporary one, so that
// ".<name>.tmp-<pid>-<random>" stays within NAME_MAX (255).
constexpr std::size_t kMaxNameInTemp = 200;
// ".<name>" + kTempMarker + "<pid>-<random>"
constexpr std::string_view kTempMarker = ".tmp-";

struct Resolved {
  std::string target;  // the file to replace: symbolic links followed
  bool in_place = false;
};

std::string real_directory(const fs::path& p) {
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  char buffer[PATH_MAX];
  if (::realpath(dir.c_str(), buffer) == nullptr) return {};
  return buffer;
}

[[noreturn]] void throw_write_error(const std::string& path, const std::string& step, int error_number);

// The kernel's protected_symlinks rule: a link in a sticky, world-writable
// folder is followed only when it belongs to the folder's owner or to the
// user following it. Applied here because the writer resolves links itself
// (to rename over the target), where the kernel never sees the link.
[[gnu::cold]] [[noreturn]] void refuse_foreign_link(const std::string& path, const std::string& link,
                                                    const std::string& dir, uid_t owner) {
  throw_write_error(path,
                    "'" + link + "' is a symbolic link owned by uid " + std::to_string(owner) +
                        " in the sticky world-writable folder '" + dir +
                        "', which another user may have planted to aim this output at a file of yours (the "
                        "kernel's protected_symlinks refuses to follow such a link too); remove the link or "
                        "name the file it should lead to",
                    EACCES);
}

// Follows symbolic links at the final name. A name reached through /proc
// (/dev/stdout is /proc/self/fd/1) stands for a descriptor that another
// process or the shell holds open: it is written in place, since a rename
// would put the bytes where that descriptor no longer points.
Resolved resolve(const std::string& path) {
  Resolved r{path, false};
  for (int hops = 0; hops < 40; ++hops) {
    const fs::path p(r.target);
    const std::string dir = real_directory(p);
    if (dir.empty()) return r;  // the directory is missing: creating the temporary file says so
    if (dir == "/proc" || dir.rfind("/proc/", 0) == 0) {
      r.in_place = true;
      return r;
    }
    struct stat st {};
    if (::lstat(r.target.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return r;
    struct stat folder {};
    if (::stat(dir.c_str(), &folder) == 0 && (folder.st_mode & S_ISVTX) != 0 &&
        (folder.st_mode & S_IWOTH) != 0 && st.st_uid != folder.st_uid && st.st_uid != ::geteuid())
      refuse_foreign_link(path, r.target, dir, st.st_uid);
    char link[PATH_MAX];
    const ssize_t n = ::readlink(r.target.c_str(), link, sizeof link - 1);
    if (n < 0) return r;
    const fs::path next(std::string(link, static_cast<std::size_t>(n)));
    r.target = next.is_absolute() ? next.string() : (fs::path(dir) / next).string();
  }
  return r;
}

[[noreturn]] void throw_write_error(const std::string& path, const std::string& step, int error_number) {
  throw FileWriteError("cannot write '" + path + "': " + step + ": " + std::strerror(error_number),
                       error_number);
}

// The final name's state: whether it exists (st then holds its stat) and
// whether it is written in place rather than replaced.
struct Target {
  Resolved resolved;
  struct stat st {};
  bool exists = false;
  LinkPolicy links = LinkPolicy::follow_protected;
  bool in_place() const {
    return links == LinkPolicy::follow_protected && (resolved.in_place || (exists && !S_ISREG(st.st_mode)));
  }
};

// Under LinkPolicy::replace the name is taken as it is: lstat, never a
// link followed, never written in place.
Target inspect(const std::string& path, LinkPolicy links) {
  if (path.empty()) throw_write_error(path, "the name is empty", ENOENT);
  const bool follow = links == LinkPolicy::follow_protected;
  Target t{follow ? resolve(path) : Resolved{path, false}};
  if ((follow ? ::stat(t.resolved.target.c_str(), &t.st) : ::lstat(path.c_str(), &t.st)) == 0) {
    t.exists = true;
    if (S_ISDIR(t.st.st_mode)) throw_write_error(path, "it is a directory", EISDIR);
  } else if (errno != ENOENT) {
    throw_write_error(path, "inspecting it", errno);
  }
  t.links = links;
  return t;
}

std::string random_suffix() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  char text[32];
  std::snprintf(text, sizeof text, "%ld-%x%x", static_cast<long>(::getpid()), counter++, rd() & 0xffffffu);
  return text;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, LinkPolicy links) : path_(std::move(path)) {
  const Target t = inspect(path_, links);
  target_ = t.resolved.target;
  if (t.in_place()) {
    fd_.reset(::open(target_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOCTTY));
    if (!fd_.valid()) fail("opening it", errno);
    return;
  }

  const fs::path final_path(target_);
  const fs::path dir = final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  const std::string name = final_path.filename().string().substr(0, kMaxNameInTemp);
  for (int attempt = 0;; ++attempt) {
    const std::string temp = (dir / ("." + name + std::string(kTempMarker) + random_suffix())).string();
    fd_.reset(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666));
    if (fd_.valid()) {
      temp_ = temp;
      break;
    }
    if (errno != EEXIST || attempt == 100) fail("creating a temporary file in '" + dir.string() + "'", errno);
  }
  // The replacement keeps the permissions of the file it replaces (not of a
  // link it replaces: a link's mode means nothing).
  if (t.exists && S_ISREG(t.st.st_mode) && ::fchmod(fd_.get(), t.st.st_mode & 07777) != 0)
    fail("setting the mode of its temporary file '" + temp_ + "'", errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  fd_.reset();
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFileWriter::fail(const std::string& step, int error_number) const {
  throw_write_error(path_, step, error_number);
}

void AtomicFileWriter::write(const void* data, std::size_t size) {
  if (committed_ || !fd_.valid()) fail("writing after the file was committed", EBADF);
  const std::string what =
      temp_.empty() ? std::string("writing it") : "writing its temporary file '" + temp_ + "'";
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_.get(), bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(what, errno);
    }
    if (n == 0) fail(what, EIO);
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (committed_ || !fd_.valid()) fail("committing it twice", EBADF);
  if (temp_.empty()) {
    // In place (a device, a FIFO, a descriptor under /proc): fsync means
    // nothing to most of these, so only its result on a regular file counts.
    struct stat st {};
    if (::fstat(fd_.get(), &st) == 0 && S_ISREG(st.st_mode) && ::fsync(fd_.get()) != 0) fail("fsync", errno);
    if (::close(fd_.release()) != 0) fail("closing it", errno);
    committed_ = true;
    return;
  }
  if (::fsync(fd_.get()) != 0) fail("fsync of its temporary file '" + temp_ + "'", errno);
  // Closed once, whatever the result: close(2) must not be retried on Linux.
  if (::close(fd_.release()) != 0) fail("closing its temporary file '" + temp_ + "'", errno);
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    fail("renaming its temporary file '" + temp_ + "' to it", errno);
  committed_ = true;
  // Makes the rename itself durable; a file system without directory fsync says EINVAL.
  const std::string dir = real_directory(fs::path(target_));
  UniqueFd d(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid() || (::fsync(d.get()) != 0 && errno != EINVAL))
    fail("fsync of its directory '" + dir + "' after the rename", errno);
}

void write_file_atomically(const std::string& path, std::string_view contents, LinkPolicy links) {
  AtomicFileWriter out(path, links);
  out.write(contents);
  out.commit();
}

std::optional<std::string> final_name_of_temporary(std::string_view file_name) {
  const std::size_t marker = file_name.rfind(kTempMarker);
  if (file_name.size() < 2 || file_name[0] != '.' || marker == std::string_view::npos || marker < 2 ||
      marker + kTempMarker.size() == file_name.size())
    return std::nullopt;
  return std::string(file_name.substr(1, marker - 1));
}

void check_file_writable(const std::string& path, LinkPolicy links) {
  // Written in place: opening it now would truncate it, or block on a FIFO.
  if (const Target t = inspect(path, links); t.in_place()) {
    if (::access(t.resolved.target.c_str(), W_OK) != 0) throw_write_error(path, "opening it", errno);
    return;
  }
  AtomicFileWriter probe(path, links);
}

}  // namespace backplane::common
