// Writing an output file (the CLI's --metrics-out and --plot, later a
// checkpoint) so that its name never holds an empty or partial file: the
// bytes go to a temporary file beside it, which is flushed, fsync'ed, closed
// with its result checked, and renamed over the name only when all of that
// succeeded.
#ifndef BACKPLANE_COMMON_ATOMIC_FILE_HPP_
#define BACKPLANE_COMMON_ATOMIC_FILE_HPP_

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "backplane_common/unique_fd.hpp"

namespace backplane::common {

// Why an output file could not be written; what() names the file, the step
// that failed and the OS error (strerror): "cannot write '/x/m.json': writing
// its temporary file '/x/.m.json.tmp-...': No space left on device".
class FileWriteError : public std::runtime_error {
 public:
  FileWriteError(const std::string& message, int error_number)
      : std::runtime_error(message), error_number_(error_number) {}
  int error_number() const noexcept { return error_number_; }  // the errno value

 private:
  int error_number_;
};

// What a writer does when the final name is a symbolic link.
enum class LinkPolicy {
  // The link stays and its target is replaced (a user's link to where the
  // file should go), as open(2) would follow it -- except where the kernel's
  // protected_symlinks refuses to follow: a link in a sticky, world-writable
  // folder (/tmp) owned neither by the folder's owner nor by this process's
  // user is refused (EACCES), so another user's link cannot aim a root
  // job's output at a file of root's.
  follow_protected,
  // The link itself is replaced by the file; nothing it points at is read or
  // written. For names inside a folder the program owns (checkpoints).
  replace,
};

// One output file, written in full or not at all. The constructor creates
// the temporary file ".<name>.tmp-<pid>-<random>" in the final file's
// directory (same file system, so the rename is atomic), with the mode of
// the file it replaces, else 0666 less the umask; write() appends; commit()
// flushes, fsyncs, closes, renames it into place and fsyncs the directory.
// Destroyed without a successful commit(), it removes the temporary file and
// leaves the final name as it was. A final name that is a symbolic link is
// treated as `links` says (see LinkPolicy). Under follow_protected, a name that
// exists and is neither a regular file nor a directory (a device such as
// /dev/null, a FIFO), or that leads into /proc (/dev/stdout is
// /proc/self/fd/1, a descriptor the shell holds open), is written in place
// and truncated first: there is nothing to rename, or a rename would miss
// that descriptor; under replace, such a name is replaced like any other.
// A directory is refused. Every failure throws FileWriteError. One owner at
// a time; not thread-safe.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, LinkPolicy links = LinkPolicy::follow_protected);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Puts the file in place; after it, write() and commit() throw.
  void commit();

  const std::string& path() const { return path_; }  // the final name, as given

 private:
  [[noreturn]] void fail(const std::string& step, int error_number) const;

  std::string path_;    // as given, for messages
  std::string target_;  // what is replaced: path_, or the file its links lead to
  std::string temp_;    // empty when writing in place
  UniqueFd fd_;
  bool committed_ = false;
};

// Writes `contents` to `path` through an AtomicFileWriter.
void write_file_atomically(const std::string& path, std::string_view contents,
                           LinkPolicy links = LinkPolicy::follow_protected);

// The final name an AtomicFileWriter's temporary file ".<name>.tmp-<suffix>"
// stands for ("m.json" for ".m.json.tmp-12-ab3f"), or nullopt for any other
// file name: for a program that clears what writes a crash interrupted. A
// final name over 200 bytes is cut to its first 200 in the temporary's.
std::optional<std::string> final_name_of_temporary(std::string_view file_name);

// Whether write_file_atomically(path, ...) can start: creates its temporary
// file and removes it again, leaving `path` itself untouched. For a check
// before long work whose result goes to `path`. Throws FileWriteError.
void check_file_writable(const std::string& path, LinkPolicy links = LinkPolicy::follow_protected);

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_ATOMIC_FILE_HPP_
