// `moecore report RUN.jsonl [MORE.jsonl ...] -o report.html`: one self-contained HTML file with the runs' curves and
// expert-load heatmaps (report/report_page.h), the charting library embedded at build time.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moecore::cli {

struct ReportArgs {
  CLI::App* cmd = nullptr;
  std::vector<std::string> inputs, names;
  std::string output = "report.html";
};
void add_report_command(CLI::App& app, ReportArgs& a);
void run_report(const ReportArgs& a);

}  // namespace moecore::cli
