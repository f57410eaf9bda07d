// Slurm's compressed host lists: the first host, after checking the list.
#include "distributed/slurm_hostlist.hpp"

#include <backplane/error.hpp>

#include <cstddef>
#include <string_view>

namespace backplane::slurm {

namespace {

[[noreturn]] void malformed(const char* variable, const std::string& hostlist, const std::string& what) {
  std::string shown = hostlist;  // printable in a message, whatever the variable holds
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) c = '?';
  throw Error(Errc::invalid_argument, std::string("environment variable ") + variable + "='" + shown +
                                          "' is not a Slurm host list (" + what +
                                          "); expected host names and ranges such as node[01-04,07],gpu1");
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '-' || c == '.' || c == '_';
}

// A decimal number's value, for comparing a range's ends (digits only;
// leading zeros ignored, so "007" and "7" compare equal).
int compare_numbers(std::string_view a, std::string_view b) {
  while (a.size() > 1 && a.front() == '0') a.remove_prefix(1);
  while (b.size() > 1 && b.front() == '0') b.remove_prefix(1);
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a.compare(b) < 0 ? -1 : (a == b ? 0 : 1);
}

// Checks "N", "N-M", ... between brackets; returns the first N.
std::string_view first_of_ranges(const char* variable, const std::string& hostlist, std::string_view ranges) {
  if (ranges.empty()) malformed(variable, hostlist, "empty brackets []");
  std::string_view first;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = ranges.find(',', start);
    const std::string_view range =
        ranges.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::size_t dash = range.find('-');
    const std::string_view lo = range.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
    auto digits = [](std::string_view s) {
      if (s.empty()) return false;
      for (const char c : s)
        if (!is_digit(c)) return false;
      return true;
    };
    if (!digits(lo) || !digits(hi)) {
      malformed(variable, hostlist,
                "'[" + std::string(ranges) + "]' holds '" + std::string(range) +
                    "', which is not a number N or a range N-M");
    }
    if (compare_numbers(lo, hi) > 0) {
      malformed(variable, hostlist,
                "the range " + std::string(range) + " in '[" + std::string(ranges) + "]' runs backwards");
    }
    if (first.empty()) first = lo;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return first;
}

}  // namespace

std::string first_host(const char* variable, const std::string& hostlist) {
  if (hostlist.empty()) malformed(variable, hostlist, "it is empty");
  std::string first;
  bool in_first_entry = true;
  std::size_t entry_length = 0;
  std::size_t i = 0;
  while (i <= hostlist.size()) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == ',') {
      if (entry_length == 0) {
        malformed(
            variable, hostlist,
            i == hostlist.size() ? "it ends with a comma" : "an empty entry at offset " + std::to_string(i));
      }
      in_first_entry = false;
      entry_length = 0;
      ++i;
      continue;
    }
    if (c == '[') {
      const std::size_t close = hostlist.find_first_of("[]", i + 1);
      if (close == std::string::npos || hostlist[close] != ']') {
        malformed(variable, hostlist,
                  close == std::string::npos ? "a '[' at offset " + std::to_string(i) + " is never closed"
                                             : "brackets nest at offset " + std::to_string(close));
      }
      const std::string_view ranges = std::string_view(hostlist).substr(i + 1, close - i - 1);
      const std::string_view lo = first_of_ranges(variable, hostlist, ranges);
      if (in_first_entry) first += lo;
      entry_length += close - i + 1;
      i = close + 1;
      continue;
    }
    if (c == ']') malformed(variable, hostlist, "a ']' at offset " + std::to_string(i) + " closes nothing");
    if (!is_host_char(c)) {
      const auto byte = static_cast<unsigned char>(c);
      const std::string shown =
          byte >= 0x21 && byte < 0x7F ? "'" + std::string(1, c) + "'" : "byte " + std::to_string(byte);
      malformed(variable, hostlist,
                shown + " at offset " + std::to_string(i) + " is not part of a host name");
    }
    if (in_first_entry) first += c;
    ++entry_length;
    ++i;
  }
  return first;
}

}  // namespace backplane::slurm
