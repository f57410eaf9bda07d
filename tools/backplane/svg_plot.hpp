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
  bool markers = false;  // a dot on each point, for sparse series
};

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  // Logarithmic y axis (decade grid lines; points with y <= 0 are skipped),
  // so a loss that falls by orders of magnitude stays readable; else linear from 0.
  bool log_y = true;
};

// The SVG text of a chart of `series` (non-finite points are skipped).
std::string svg_line_chart(const ChartOptions& options, const std::vector<Series>& series);

// "0.1", "1e-05": a number for a title or a label (%g).
std::string format_number(double v);

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_SVG_PLOT_HPP_
