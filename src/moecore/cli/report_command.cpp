// `moecore report` (see report_command.h).
#include "moecore/cli/report_command.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/report/report_page.h"

namespace moecore::report {
// ECharts' minified script, compiled in from .deps/npm by CMake (empty when it was not installed at configure time).
extern const char* const kChartLibraryJs;
extern const char* const kChartLibraryVersion;
}  // namespace moecore::report

namespace moecore::cli {

void add_report_command(CLI::App& app, ReportArgs& a) {
  a.cmd = app.add_subcommand("report",
                             "One self-contained HTML file (opens offline) with the curves and expert-load heatmaps "
                             "of one or more runs' --metrics-file, overlaid");
  a.cmd->add_option("metrics", a.inputs, "Metrics JSON-lines files of moecore train --metrics-file")
      ->required()
      ->check(CLI::ExistingFile);
  a.cmd->add_option("-o,--output", a.output, "The HTML file to write")->capture_default_str();
  a.cmd->add_option("-n,--name", a.names,
                    "A run's name in legends, once per metrics file in order (default: the file's stem, or its "
                    "directory for metrics.jsonl)");
}

void run_report(const ReportArgs& a) {
  MOE_CHECK(std::strlen(report::kChartLibraryJs) > 0,
            "moecore report: this moecore was built without the charting library (ECharts from npm, in "
            ".deps/npm/node_modules/echarts): run scripts/install-deps.sh, then configure and build again");
  MOE_CHECK(a.names.empty() || a.names.size() == a.inputs.size(),
            "moecore report: {} --name for {} metrics files: give one name per file, in order, or none", a.names.size(),
            a.inputs.size());
  std::vector<report::RunHistory> runs;
  for (size_t i = 0; i < a.inputs.size(); i++)
    runs.push_back(
        report::read_run_history(a.inputs[i], a.names.empty() ? report::default_run_name(a.inputs[i]) : a.names[i]));
  const std::string page = report::render_report_html(
      runs, report::kChartLibraryJs,
      fmt::format("moecore {} report, ECharts {}", MOECORE_VERSION, report::kChartLibraryVersion));
  write_file_atomic(a.output, page);
  size_t charts = report::plan_charts(runs).size();
  fmt::print("report: {} run(s), {} charts -> {} ({:.1f} MB; open it in a browser, no network needed)\n", runs.size(),
             charts, a.output, static_cast<double>(page.size()) / 1e6);
}

}  // namespace moecore::cli
