// The report's HTML page: run table, chart containers, the embedded chart library, data and script (see
// report_page.h). Text from the metrics files goes through html_escape (HTML) or json_for_script (the data).
#include <fmt/format.h>

#include <cmath>

#include "moecore/core/error.h"
#include "moecore/report/report_page.h"

namespace moecore::report {

namespace {
using nlohmann::json;

const char* const kStyle = R"css(
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #222; background: #fafafa; }
h1 { font-size: 20px; margin: 0 0 8px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child, td.path { text-align: left; }
#charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.chart { height: 320px; background: #fff; border: 1px solid #ddd; border-radius: 4px; }
.chart.tall { height: 420px; }
footer { margin-top: 16px; font-size: 12px; color: #666; }
)css";

std::string fixed(const json& row, const char* key, const char* fmt_spec) {
  if (auto it = row.find(key); it != row.end() && it->is_number())
    return fmt::format(fmt::runtime(fmt_spec), it->get<double>());
  return "–";
}

std::string run_table(const std::vector<RunHistory>& runs) {
  std::string t =
      "<table id=\"runs\"><tr><th>run</th><th>metrics file</th><th>logged steps</th><th>last iteration</th>"
      "<th>last lm loss</th><th>last validation loss</th><th>mean tokens/s</th></tr>\n";
  for (const auto& r : runs) {
    double tps = 0;
    int n = 0;
    for (const json& row : r.train)
      if (auto it = row.find("tokens_per_sec"); it != row.end() && it->is_number()) {
        tps += it->get<double>();
        n++;
      }
    const json last = r.train.empty() ? json::object() : r.train.back();
    const json last_valid = r.valid.empty() ? json::object() : r.valid.back();
    const int64_t last_it = std::max(r.train.empty() ? 0 : r.train.back().at("iteration").get<int64_t>(),
                                     r.valid.empty() ? 0 : r.valid.back().at("iteration").get<int64_t>());
    t += fmt::format(
        "<tr><td>{}</td><td class=\"path\">{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
        html_escape(r.name), html_escape(r.path),
        r.skipped_lines > 0 ? fmt::format(" ({} cut-off line skipped)", r.skipped_lines) : "", r.train.size(), last_it,
        fixed(last, "lm_loss", "{:.4f}"), fixed(last_valid, "lm_loss", "{:.4f}"),
        n > 0 ? fmt::format("{:.0f}", tps / n) : "–");
  }
  return t + "</table>\n";
}
}  // namespace

std::string render_report_html(const std::vector<RunHistory>& runs, std::string_view chart_library_js,
                               const std::string& generator) {
  MOE_CHECK(!runs.empty(), "moecore report: no runs given");
  // The library is embedded as it is: a "</script" inside it would end its element early.
  std::string lower(chart_library_js.substr(0, chart_library_js.size()));
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  MOE_ASSERT(lower.find("</script") == std::string::npos);
  const json charts = plan_charts(runs);
  json names = json::array();
  for (const auto& r : runs) names.push_back(r.name);
  const json data = {{"runs", names}, {"charts", charts}};
  std::string title = "moecore report: ";
  for (size_t i = 0; i < runs.size(); i++) title += (i ? ", " : "") + runs[i].name;
  std::string page;
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += fmt::format("<title>{}</title>\n<style>{}</style>\n", html_escape(title), kStyle);
  // Errors are counted from the first script on, so a failure of the library itself is seen too.
  page +=
      "<script>window.moeErrors = [];\n"
      "window.addEventListener('error', function (e) { window.moeErrors.push(String(e.message)); "
      "document.documentElement.setAttribute('data-errors', window.moeErrors.length); });\n"
      "(function () { var ce = console.error; console.error = function () { "
      "window.moeErrors.push(Array.prototype.join.call(arguments, ' ')); "
      "document.documentElement.setAttribute('data-errors', window.moeErrors.length); "
      "return ce.apply(console, arguments); }; })();</script>\n";
  page += "</head>\n";
  page += fmt::format("<body data-expected-charts=\"{}\" data-charts=\"0\">\n", charts.size());
  page += fmt::format("<h1>{}</h1>\n", html_escape(title));
  page += run_table(runs);
  page += "<div id=\"charts\"></div>\n";
  page += fmt::format("<footer>{} · charts: Apache ECharts (embedded; the page needs no network)</footer>\n",
                      html_escape(generator));
  page += "<script>";
  page += chart_library_js;
  page += "</script>\n<script type=\"application/json\" id=\"report-data\">";
  page += json_for_script(data);
  page += "</script>\n<script>";
  page += kReportScript;
  page += "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace moecore::report
