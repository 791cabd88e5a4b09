// Prometheus exposition, written by hand (prometheus-cpp is not packaged in Debian 12): the text
// format 0.0.4 and OpenMetrics 1.0.0 from one writer, so every family is rendered the same way in
// both. Used by the sampler to pre-render snapshots; never on the scrape path.
//
// Not thread-safe; one writer renders one document into a caller-owned string.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace gpulet::metrics {

enum class Format { kText, kOpenMetrics };
enum class MetricType { kGauge, kCounter };

inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";
inline constexpr std::string_view kOpenMetricsContentType =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

// True when an HTTP Accept header asks for OpenMetrics (what Prometheus sends by default).
bool WantsOpenMetrics(std::string_view accept_header);

// Whether an Accept-Encoding header admits gzip ("gzip" or "x-gzip" without q=0). Prometheus
// always sends "Accept-Encoding: gzip".
bool AcceptsGzip(std::string_view accept_encoding_header);

// A gzip stream (RFC 1952) of a body, left open so that each response can append its own short
// tail and close it: the body is compressed once per sampling cycle, and a scrape only adds one
// stored deflate block and the trailer (no zlib state per request, one valid gzip member).
struct OpenGzip {
  std::string data;   // gzip header + deflate blocks of the body, flushed to a byte boundary
  uint32_t crc = 0;   // CRC-32 of the body
  uint64_t size = 0;  // body length
};
OpenGzip GzipOpen(std::string_view body);
// The bytes that follow g.data: `tail` (at most 65535 bytes) as the final block, then the trailer.
std::string GzipClose(const OpenGzip& g, std::string_view tail);

// Appends `v` as a label value body: `\` `"` and newline escaped, invalid UTF-8 replaced by U+FFFD
// (Prometheus rejects invalid UTF-8 label values, and pod names reach us from outside).
void AppendEscapedLabelValue(std::string* out, std::string_view v);

// Shortest round-trip representation of a sample value; integers without exponent up to 2^53,
// NaN / +Inf / -Inf spelled as the formats require.
void AppendValue(std::string* out, double v);

using Label = std::pair<std::string_view, std::string_view>;  // name, unescaped value

// `{a="x",b="y"}` with values escaped; "" for no labels.
std::string LabelBlock(std::initializer_list<Label> labels);

class ExpositionWriter {
 public:
  ExpositionWriter(Format format, std::string* out) : format_(format), out_(out) {}

  // Starts a family: HELP and TYPE lines. Every Sample() until the next Family() belongs to it.
  // OpenMetrics: a counter named `x_total` is declared as family `x` (samples keep `x_total`); a
  // counter without that suffix (DCGM names) is declared `unknown`, which OpenMetrics allows.
  void Family(std::string_view name, MetricType type, std::string_view help);

  // One sample of the current family. Label values are escaped here.
  void Sample(std::initializer_list<Label> labels, double value) {
    Sample(labels.begin(), labels.size(), value);
  }
  void Sample(const Label* labels, size_t n, double value);

  // One sample whose label block ("" or "{a=\"x\",...}", already escaped: see LabelBlock) was
  // built once and is reused across families.
  void SampleWithBlock(std::string_view block, double value);

  // Starts a sample by hand for callers that build label sets incrementally:
  // BeginSample(); AddLabel(...)...; EndSample(value).
  void BeginSample();
  void AddLabel(std::string_view name, std::string_view value);
  void EndSample(double value);

  // OpenMetrics requires the terminating `# EOF` line; a no-op for the text format.
  void Finish();

 private:
  Format format_;
  std::string* out_;
  std::string name_;  // current family's sample name
  bool first_label_ = true;
};

}  // namespace gpulet::metrics
