// `backplane trace merge` and `backplane trace summary`: the parts a job's
// ranks left joined into one timeline, and the table a user reads first
// (per rank: step time, time in ops by device, in fallbacks and their
// copies, in collectives, idle; the top ops; the copies by bytes with the op
// that needed each).
#include "cli.hpp"

#include <backplane/error.hpp>
#include <backplane/trace.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace backplane::cli {
namespace {

using nlohmann::json;

int run_merge(const std::vector<std::string>& inputs, std::string output) {
  std::vector<std::string> parts;
  for (const std::string& in : inputs) {
    // A trace file's name stands for the parts its job left beside it; with
    // none there, for the trace itself (one merged before: a server's).
    std::vector<std::string> found;
    if (in.size() > 5 && in.compare(in.size() - 5, 5, ".part") == 0) {
      found = {in};
    } else {
      found = trace::parts_of(in);
      if (found.empty() && std::filesystem::exists(in)) found = {in};
    }
    if (found.empty())
      throw CommandError(kExitUsage, "trace merge: '" + in + "' does not exist, and no " + in +
                                         ".rank<R>.part files exist beside it");
    parts.insert(parts.end(), found.begin(), found.end());
    if (output.empty() && inputs.size() == 1 && found.front() != in) output = in;
  }
  if (output.empty())
    throw CommandError(kExitUsage,
                       "trace merge: name the merged file with -o FILE (it is taken from the "
                       "input only when that is one trace whose parts lie beside it)");
  trace::MergeResult m;
  try {
    m = trace::merge(parts, output);
  } catch (const Error& e) {
    throw CommandError(e.code() == Errc::invalid_argument ? kExitUsage : kExitFailed, e.message());
  }
  std::printf("merged %zu part(s), %llu events, into %s", m.ranks, static_cast<unsigned long long>(m.events),
              output.c_str());
  if (m.incomplete > 0) std::printf(" (%zu ended early: a rank died while recording)", m.incomplete);
  if (m.dropped > 0)
    std::printf(" (%llu events over --trace-max-events were not kept)",
                static_cast<unsigned long long>(m.dropped));
  std::printf("\n");
  return 0;
}

struct Totals {
  double us = 0;
  uint64_t count = 0;
  uint64_t bytes = 0;
};

struct RankSummary {
  double first = 1e300, last = -1e300;
  std::vector<double> steps;
  std::map<std::string, Totals> ops_by_device;  // device -> native op time
  Totals fallback, copy, collective;
  double collective_wait_us = 0;             // of it, waiting for the peers (the transport's wait_ns)
  std::map<std::string, Totals> transports;  // the plugin's transport spans, by name
};

json summarize(const json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw CommandError(kExitUsage,
                       "trace summary: the file is not a trace (no \"traceEvents\" array); "
                       "give the file --trace wrote, or run `backplane trace merge` on its parts");
  std::map<int64_t, RankSummary> ranks;
  std::map<std::string, std::map<std::string, std::string>> names;
  std::map<std::tuple<std::string, std::string>, Totals> top;                  // (op, dtype)
  std::map<std::tuple<std::string, std::string, std::string>, Totals> copies;  // (from, to, needed_by)
  std::map<std::tuple<std::string, std::string, std::string, std::string>, Totals> fallbacks;
  for (const json& e : trace["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("ts")) continue;
    const int64_t pid = e.value("pid", int64_t{0});
    const double ts = e.value("ts", 0.0);
    const double dur = e.value("dur", 0.0);
    const std::string cat = e.value("cat", "");
    const std::string name = e.value("name", "");
    const json args = e.value("args", json::object());
    RankSummary& r = ranks[pid];
    r.first = std::min(r.first, ts);
    r.last = std::max(r.last, ts + dur);
    const std::string device = args.value("device", "");
    const std::string dtype = args.value("dtype", "");
    if (cat == "range" && name == "step") {
      r.steps.push_back(dur);
    } else if (cat == "op") {
      Totals& t = r.ops_by_device[device];
      t.us += dur;
      ++t.count;
      Totals& o = top[{name, dtype}];
      o.us += dur;
      ++o.count;
    } else if (cat == "fallback") {
      r.fallback.us += dur;
      ++r.fallback.count;
      Totals& o = top[{name, dtype}];
      o.us += dur;
      ++o.count;
      Totals& f = fallbacks[{name, dtype, args.value("for", ""), device}];
      f.us += dur;
      ++f.count;
    } else if (cat == "copy") {
      const auto bytes = args.value("bytes", uint64_t{0});
      r.copy.us += dur;
      ++r.copy.count;
      r.copy.bytes += bytes;
      Totals& c = copies[{device, args.value("to", ""), args.value("needed_by", "")}];
      c.us += dur;
      ++c.count;
      c.bytes += bytes;
    } else if (cat == "transport") {
      r.collective_wait_us += args.value("wait_ns", 0.0) / 1000.0;
      Totals& t = r.transports[name];
      t.us += dur;
      ++t.count;
    } else if (cat == "collective") {
      r.collective.us += dur;
      ++r.collective.count;
      r.collective.bytes += args.value("bytes", uint64_t{0});
    }
  }
  json out = {{"ranks", json::array()},
              {"top_ops", json::array()},
              {"fallbacks", json::array()},
              {"copies", json::array()}};
  for (const auto& [pid, r] : ranks) {
    double steps_total = 0;
    for (double s : r.steps) steps_total += s;
    double ops_us = 0;
    json by_device = json::object();
    for (const auto& [device, t] : r.ops_by_device) {
      ops_us += t.us;
      by_device[device] = {{"us", t.us}, {"calls", t.count}};
    }
    json transports = json::object();
    for (const auto& [name, t] : r.transports) transports[name] = {{"us", t.us}, {"calls", t.count}};
    const double wall = r.last > r.first ? r.last - r.first : 0;
    const double busy = ops_us + r.fallback.us + r.copy.us + r.collective.us;
    out["ranks"].push_back(
        {{"rank", pid},
         {"wall_us", wall},
         {"steps", r.steps.size()},
         {"step_us_mean", r.steps.empty() ? json(nullptr) : json(steps_total / r.steps.size())},
         {"ops_us", ops_us},
         {"ops_by_device", by_device},
         {"fallback_us", r.fallback.us},
         {"fallback_calls", r.fallback.count},
         {"copy_us", r.copy.us},
         {"copy_bytes", r.copy.bytes},
         {"collective_us", r.collective.us},
         {"collective_calls", r.collective.count},
         {"collective_bytes", r.collective.bytes},
         {"collective_wait_us", r.collective_wait_us},
         {"transports", transports},
         {"idle_us", std::max(0.0, wall - busy)}});
  }
  std::vector<std::pair<std::tuple<std::string, std::string>, Totals>> ops(top.begin(), top.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  for (std::size_t i = 0; i < ops.size() && i < 15; ++i) {
    const auto& [key, t] = ops[i];
    out["top_ops"].push_back({{"op", std::get<0>(key)},
                              {"dtype", std::get<1>(key)},
                              {"calls", t.count},
                              {"us", t.us},
                              {"us_mean", t.us / static_cast<double>(t.count)}});
  }
  for (const auto& [key, t] : fallbacks)
    out["fallbacks"].push_back({{"op", std::get<0>(key)},
                                {"dtype", std::get<1>(key)},
                                {"from", std::get<2>(key)},
                                {"to", std::get<3>(key)},
                                {"calls", t.count},
                                {"us", t.us}});
  std::vector<std::pair<std::tuple<std::string, std::string, std::string>, Totals>> cs(copies.begin(),
                                                                                       copies.end());
  std::sort(cs.begin(), cs.end(),
            [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  for (const auto& [key, t] : cs)
    out["copies"].push_back({{"from", std::get<0>(key)},
                             {"to", std::get<1>(key)},
                             {"needed_by", std::get<2>(key)},
                             {"copies", t.count},
                             {"bytes", t.bytes},
                             {"us", t.us}});
  return out;
}

std::string ms(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", us / 1000.0);
  return buf;
}

void print_summary(const json& s) {
  std::printf("%-5s %9s %6s %11s %10s %12s %10s %12s %10s\n", "rank", "wall ms", "steps", "step ms", "ops ms",
              "fallback ms", "copy ms", "collect. ms", "idle ms");
  for (const json& r : s["ranks"]) {
    const std::string step = r["step_us_mean"].is_null() ? "-" : ms(r["step_us_mean"].get<double>());
    std::printf("%-5lld %9s %6zu %11s %10s %12s %10s %12s %10s\n",
                static_cast<long long>(r["rank"].get<int64_t>()), ms(r["wall_us"].get<double>()).c_str(),
                r["steps"].get<std::size_t>(), step.c_str(), ms(r["ops_us"].get<double>()).c_str(),
                ms(r["fallback_us"].get<double>()).c_str(), ms(r["copy_us"].get<double>()).c_str(),
                ms(r["collective_us"].get<double>()).c_str(), ms(r["idle_us"].get<double>()).c_str());
    for (const auto& [device, t] : r["ops_by_device"].items())
      std::printf("      ops on %s: %s ms in %llu calls\n", device.c_str(), ms(t["us"].get<double>()).c_str(),
                  static_cast<unsigned long long>(t["calls"].get<uint64_t>()));
    if (r["collective_calls"].get<uint64_t>() > 0) {
      const double total = r["collective_us"].get<double>(), wait = r["collective_wait_us"].get<double>();
      std::string over;
      for (const auto& [name, t] : r["transports"].items()) over += (over.empty() ? " over " : ", ") + name;
      std::printf("      collectives%s: %s ms waiting for peers, %s ms moving and reducing bytes\n",
                  over.c_str(), ms(wait).c_str(), ms(std::max(0.0, total - wait)).c_str());
    }
  }
  std::printf("\ntop ops by total time (all ranks)\n%-16s %-6s %8s %10s %10s\n", "op", "dtype", "calls",
              "total ms", "mean us");
  for (const json& o : s["top_ops"])
    std::printf("%-16s %-6s %8llu %10s %10.2f\n", o["op"].get<std::string>().c_str(),
                o["dtype"].get<std::string>().c_str(),
                static_cast<unsigned long long>(o["calls"].get<uint64_t>()),
                ms(o["us"].get<double>()).c_str(), o["us_mean"].get<double>());
  if (!s["fallbacks"].empty()) {
    std::printf("\nop fallbacks\n");
    for (const json& f : s["fallbacks"])
      std::printf("  %s/%s for %s ran on %s: %llu calls, %s ms\n", f["op"].get<std::string>().c_str(),
                  f["dtype"].get<std::string>().c_str(), f["from"].get<std::string>().c_str(),
                  f["to"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(f["calls"].get<uint64_t>()),
                  ms(f["us"].get<double>()).c_str());
  }
  if (!s["copies"].empty()) {
    std::printf("\ncopies by bytes (charged to the op that needed the data)\n");
    for (const json& c : s["copies"])
      std::printf("  %s -> %s for %s: %llu copies, %llu bytes, %s ms\n", c["from"].get<std::string>().c_str(),
                  c["to"].get<std::string>().c_str(), c["needed_by"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(c["copies"].get<uint64_t>()),
                  static_cast<unsigned long long>(c["bytes"].get<uint64_t>()),
                  ms(c["us"].get<double>()).c_str());
  }
}

int run_summary(const std::string& file, bool as_json) {
  std::ifstream in(file);
  if (!in) throw CommandError(kExitUsage, "trace summary: cannot open '" + file + "'");
  json trace = json::parse(in, nullptr, false);
  if (trace.is_discarded())
    throw CommandError(kExitUsage, "trace summary: '" + file +
                                       "' is not JSON (a part of a running or killed job? merge the parts "
                                       "first: backplane trace merge FILE)");
  json s;
  try {
    s = summarize(trace);
  } catch (const json::exception& e) {
    throw CommandError(kExitUsage,
                       "trace summary: '" + file + "' has an event of the wrong shape: " + e.what());
  }
  if (as_json) {
    std::printf("%s\n", s.dump(2).c_str());
  } else {
    print_summary(s);
  }
  return 0;
}

}  // namespace

Command add_trace_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand("trace", "Merge and summarise the timelines --trace writes");
  app->require_subcommand(1);
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto output = std::make_shared<std::string>();
  CLI::App* merge = app->add_subcommand(
      "merge", "Join a job's per-rank parts (FILE.rank<R>.part) into one trace, each rank's clock aligned");
  merge->add_option("inputs", *inputs, "Trace files (their parts are found beside them) or part files")
      ->required()
      ->type_name("FILE");
  merge->add_option("-o,--output", *output, "The merged file (default: the trace file the parts belong to)")
      ->type_name("FILE");
  auto file = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  CLI::App* summary =
      app->add_subcommand("summary",
                          "Per rank: step time, op time by device, fallbacks, copies, collectives, "
                          "idle; the top ops; the copies by bytes");
  summary->add_option("file", *file, "A merged trace")->required()->type_name("FILE");
  summary->add_flag("--json", *as_json, "Print the summary as JSON, for scripts");
  Command c;
  c.app = app;
  c.run = [=] {
    if (merge->parsed()) return run_merge(*inputs, *output);
    return run_summary(*file, *as_json);
  };
  return c;
}

}  // namespace backplane::cli
