// Sub-step boundaries and their trace (see substeps.h). One schedule runs per process at a time; state is
// process-wide.
#include "moecore/nn/substeps.h"

#include <algorithm>
#include <utility>

#include "moecore/core/error.h"

namespace moecore::nn {

namespace {
SubStepSwitch* g_substep_switch = nullptr;
bool g_substep_tracing = false;
std::vector<SubStepRecord> g_substep_trace;
std::vector<SubStepRecord::InFlight> g_substep_in_flight;
}  // namespace

const char* a2a_name(A2A a) {
  switch (a) {
    case A2A::Dispatch:
      return "dispatch";
    case A2A::Combine:
      return "combine";
    case A2A::CombineBackward:
      return "combine-backward";
    case A2A::DispatchBackward:
      return "dispatch-backward";
  }
  return "?";
}

void SubSteps::boundary(const std::string& layer, const char* next) {
  if (!g_substep_switch) return;
  g_substep_switch->boundary();
  if (g_substep_tracing)
    g_substep_trace.push_back(
        {g_substep_switch->micro_batch(), g_substep_switch->forward(), layer, next, g_substep_in_flight});
}

void SubSteps::posted(const std::string& layer, A2A kind) {
  if (!g_substep_switch) return;
  g_substep_in_flight.push_back({g_substep_switch->micro_batch(), g_substep_switch->forward(), layer, kind});
}

void SubSteps::waited(const std::string& layer, A2A kind) {
  if (!g_substep_switch) return;
  const int64_t m = g_substep_switch->micro_batch();
  auto it = std::find_if(g_substep_in_flight.begin(), g_substep_in_flight.end(), [&](const SubStepRecord::InFlight& f) {
    return f.micro_batch == m && f.layer == layer && f.kind == kind;
  });
  MOE_ASSERT(it != g_substep_in_flight.end());
  g_substep_in_flight.erase(it);
}

void SubSteps::set_switch(SubStepSwitch* s) {
  g_substep_switch = s;
  if (!s) g_substep_in_flight.clear();
}

SubStepSwitch* SubSteps::active() {
  return g_substep_switch;
}

void SubSteps::set_tracing(bool on) {
  g_substep_tracing = on;
}

std::vector<SubStepRecord> SubSteps::take_trace() {
  return std::exchange(g_substep_trace, {});
}

}  // namespace moecore::nn
