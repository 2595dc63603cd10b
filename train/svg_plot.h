// A minimal line plot written as SVG (no dependencies): loss curves for the
// precision sweep.
#pragma once

#include <string>
#include <vector>

namespace precis::train {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
};

// Writes an SVG line chart of `series` to `path` (tmp + rename), with axes, ticks and a legend.
void write_svg_plot(const std::string& path, const std::string& title, const std::string& x_label,
                    const std::string& y_label, const std::vector<PlotSeries>& series);

}  // namespace precis::train
