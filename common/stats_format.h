// stats_format: how gradsyncctl prints what the Control service returns.
// Pure functions of the messages (no RPC), so each output format is unit
// tested on hand-built Stats / Config.
//
//   FormatStatsTable       `gradsyncctl stats`: header lines, a trainers table,
//                          a buckets table (latencies in µs), errors, stalls
//   FormatJson             `stats --json`, `config get --json`: protobuf's
//                          JSON mapping with proto field names, every field
//                          printed (uint64 values are JSON strings, per proto3)
//   FormatStatsPrometheus  `stats --prometheus`: text exposition format 0.0.4,
//                          metrics named gradsync_*, base units (seconds, bytes),
//                          latencies as histograms; gradsyncctl and the
//                          daemon's --metrics-listen endpoint both print it
//   FormatStragglersTable  `gradsyncctl stragglers`: the settings, then one row per
//                          trainer (rank, node, host, pid, lateness, share last,
//                          usual bucket, straggler) and who is named
//   FormatConfig           `config get`: KEY=VALUE lines, the keys `config set` takes
#ifndef GRADSYNC_COMMON_STATS_FORMAT_H_
#define GRADSYNC_COMMON_STATS_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync {

std::string FormatStatsTable(const v1::Stats& stats);

absl::StatusOr<std::string> FormatJson(const google::protobuf::Message& message);

std::string FormatStatsPrometheus(const v1::Stats& stats);

std::string FormatStragglersTable(const v1::GetStragglersResponse& stragglers);

std::string FormatConfig(const v1::Config& config);

// Building blocks, exposed for tests: "1.5 MiB", "812.0", "1h02m03s".
std::string FormatBytes(uint64_t bytes);
std::string FormatMicros(double us);
std::string FormatDuration(double seconds);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_STATS_FORMAT_H_
