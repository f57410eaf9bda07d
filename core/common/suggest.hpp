// "Did you mean": the closest of some names to a misspelt one, by edit
// distance (backplane_common/edit_distance.hpp). Used by the config checks,
// the registry and the loader.
#ifndef BACKPLANE_CORE_SUGGEST_HPP_
#define BACKPLANE_CORE_SUGGEST_HPP_

#include <backplane_common/edit_distance.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

// Levenshtein distance: backplane_common's, the one copy of it.
using common::edit_distance;

// The candidate closest to `name` (other than `name` itself) when it is close
// enough: fewer edits than a third of the name plus one, and at most two for
// short names, so "cpuu" finds "cpu" but "gpu0" does not find "cpu". Empty
// when none is; the first of equally close candidates wins.
template <class Names>
std::string closest_name(std::string_view name, const Names& candidates) {
  std::size_t best_d = std::max<std::size_t>(3, name.size() / 3 + 1);
  std::string best;
  for (const auto& candidate : candidates) {
    const std::string_view c(candidate);
    if (c == name) continue;
    const std::size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = std::string(c);
  }
  return best;
}

// ' (did you mean "cpu"?)' for closest_name, or "" when nothing is close.
template <class Names>
std::string did_you_mean(std::string_view name, const Names& candidates) {
  const std::string best = closest_name(name, candidates);
  return best.empty() ? std::string() : " (did you mean \"" + best + "\"?)";
}

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_SUGGEST_HPP_
