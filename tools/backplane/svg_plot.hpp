// A line chart as a standalone SVG file: enough for a loss curve, no
// dependency. Used by `backplane train --plot`.
#ifndef BACKPLANE_TOOLS_SVG_PLOT_HPP_
#define BACKPLANE_TOOLS_SVG_PLOT_HPP_

#include <string>
#include <vector>

namespace backplane::cli {

struct Series {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;
  std::string color = "#1f77b4";
};

// The SVG text of a chart of `series` (non-finite points are skipped).
std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series);

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_SVG_PLOT_HPP_
