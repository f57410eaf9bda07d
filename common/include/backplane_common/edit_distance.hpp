// Levenshtein edit distance, for "did you mean" suggestions of misspelt
// names (the core's config and loader, the remote plugin's options).
#ifndef BACKPLANE_COMMON_EDIT_DISTANCE_HPP_
#define BACKPLANE_COMMON_EDIT_DISTANCE_HPP_

#include <cstddef>
#include <string_view>

namespace backplane::common {

// The fewest insertions, deletions and substitutions of one byte that turn
// `a` into `b`.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_EDIT_DISTANCE_HPP_
