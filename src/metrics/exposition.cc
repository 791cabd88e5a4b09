#include "metrics/exposition.h"

#include <zlib.h>

#include <charconv>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"

namespace gpulet::metrics {

bool WantsOpenMetrics(std::string_view accept) {
  // Prometheus sends "application/openmetrics-text;version=1.0.0,...;q=0.75,text/plain;...;q=0.5".
  // Any mention of OpenMetrics is treated as a preference: it is listed first whenever present.
  // (Debian's absl::string_view is not std::string_view, hence plain std:: here.)
  std::string lower(accept);
  for (char& c : lower) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  return lower.find("application/openmetrics-text") != std::string::npos;
}

bool AcceptsGzip(std::string_view header) {
  std::string lower(header);
  for (char& c : lower) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  std::string_view rest(lower);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    size_t semi = item.find(';');
    std::string_view coding = item.substr(0, semi), params;
    if (semi != std::string_view::npos) params = item.substr(semi + 1);
    while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t'))
      coding.remove_prefix(1);
    while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t'))
      coding.remove_suffix(1);
    if (coding != "gzip" && coding != "x-gzip") continue;
    // "q=0", "q=0.0", "q=0.000": explicitly refused (RFC 9110 12.4.2).
    size_t q = params.find("q=");
    if (q == std::string_view::npos) return true;
    std::string_view v = params.substr(q + 2);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    bool zero = !v.empty() && v.front() == '0';
    for (size_t i = 1; zero && i < v.size(); ++i) zero = v[i] == '.' || v[i] == '0';
    return !zero;
  }
  return false;
}

OpenGzip GzipOpen(std::string_view body) {
  OpenGzip g;
  z_stream z{};
  // Level 1: the exposition is repetitive enough that it already shrinks ~20x, at a fraction of
  // level 6's CPU time per sampling cycle.
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return g;
  g.data.resize(deflateBound(&z, body.size()) + 16);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
  z.avail_in = static_cast<uInt>(body.size());
  z.next_out = reinterpret_cast<Bytef*>(g.data.data());
  z.avail_out = static_cast<uInt>(g.data.size());
  // Z_SYNC_FLUSH instead of Z_FINISH: all input out, byte-aligned, no final block, no trailer.
  int r = deflate(&z, Z_SYNC_FLUSH);
  g.data.resize(r == Z_OK && z.avail_in == 0 ? z.total_out : 0);
  deflateEnd(&z);
  g.data.shrink_to_fit();
  g.crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size()));
  g.size = body.size();
  return g;
}

std::string GzipClose(const OpenGzip& g, std::string_view tail) {
  std::string out;
  if (tail.size() > 0xFFFF) tail = tail.substr(0, 0xFFFF);  // one stored block; tails are lines
  const uint16_t n = static_cast<uint16_t>(tail.size());
  auto le = [&out](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i) & 0xFF));
  };
  out.push_back(0x01);  // BFINAL = 1, BTYPE = 00 (stored)
  le(n, 2);
  le(static_cast<uint16_t>(~n), 2);
  out.append(tail);
  uint32_t tail_crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(tail.data()), tail.size()));
  le(static_cast<uint32_t>(crc32_combine(g.crc, tail_crc, static_cast<z_off_t>(tail.size()))), 4);
  le(static_cast<uint32_t>(g.size + tail.size()), 4);  // ISIZE: length mod 2^32
  return out;
}

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid (RFC 3629: no overlongs,
// no surrogates, nothing above U+10FFFF).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  if (n == 2 && c < 0xC2) return 0;                                       // overlong
  if (n == 3 && c == 0xE0 && b(i + 1) < 0xA0) return 0;                   // overlong
  if (n == 3 && c == 0xED && b(i + 1) >= 0xA0) return 0;                  // surrogate
  if (n == 4 && c == 0xF0 && b(i + 1) < 0x90) return 0;                   // overlong
  if (n == 4 && (c > 0xF4 || (c == 0xF4 && b(i + 1) >= 0x90))) return 0;  // > U+10FFFF
  return n;
}

void AppendEscaped(std::string* out, std::string_view v, bool escape_quote) {
  for (size_t i = 0; i < v.size();) {
    char c = v[i];
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && escape_quote) {
      out->append("\\\"");
    } else if (static_cast<unsigned char>(c) < 0x80) {
      out->push_back(c);
    } else {
      size_t n = Utf8SequenceLength(v, i);
      if (n == 0) {
        out->append("\xEF\xBF\xBD");  // U+FFFD for one bad byte
        ++i;
        continue;
      }
      out->append(v.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
}

}  // namespace

void AppendEscapedLabelValue(std::string* out, std::string_view v) { AppendEscaped(out, v, true); }

void AppendValue(std::string* out, double v) {
  if (std::isnan(v)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(v)) {
    out->append(v > 0 ? "+Inf" : "-Inf");
    return;
  }
  char buf[32];
  std::to_chars_result r;
  if (std::fabs(v) < 9007199254740992.0 && v == std::floor(v)) {
    r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
  } else {
    r = std::to_chars(buf, buf + sizeof buf, v);
  }
  out->append(buf, r.ptr);
}

std::string LabelBlock(std::initializer_list<Label> labels) {
  std::string out;
  for (const auto& [name, value] : labels) {
    out.push_back(out.empty() ? '{' : ',');
    out.append(name).append("=\"");
    AppendEscapedLabelValue(&out, value);
    out.push_back('"');
  }
  if (!out.empty()) out.push_back('}');
  return out;
}

void ExpositionWriter::SampleWithBlock(std::string_view block, double value) {
  out_->append(name_).append(block).push_back(' ');
  AppendValue(out_, value);
  out_->push_back('\n');
}

void ExpositionWriter::Family(std::string_view name, MetricType type, std::string_view help) {
  name_.assign(name);
  std::string_view family = name;
  const char* type_word = type == MetricType::kGauge ? "gauge" : "counter";
  if (format_ == Format::kOpenMetrics && type == MetricType::kCounter) {
    if (name.size() > 6 && name.substr(name.size() - 6) == "_total") {
      family.remove_suffix(6);
    } else {
      type_word = "unknown";
    }
  }
  out_->append("# HELP ").append(family).push_back(' ');
  // Text 0.0.4 escapes `\` and newline in HELP; OpenMetrics also escapes `"`.
  AppendEscaped(out_, help, format_ == Format::kOpenMetrics);
  out_->append("\n# TYPE ").append(family).push_back(' ');
  out_->append(type_word).push_back('\n');
}

void ExpositionWriter::Sample(const Label* labels, size_t n, double value) {
  BeginSample();
  for (size_t i = 0; i < n; ++i) AddLabel(labels[i].first, labels[i].second);
  EndSample(value);
}

void ExpositionWriter::BeginSample() {
  out_->append(name_);
  first_label_ = true;
}

void ExpositionWriter::AddLabel(std::string_view name, std::string_view value) {
  out_->push_back(first_label_ ? '{' : ',');
  first_label_ = false;
  out_->append(name).append("=\"");
  AppendEscapedLabelValue(out_, value);
  out_->push_back('"');
}

void ExpositionWriter::EndSample(double value) {
  if (!first_label_) out_->push_back('}');
  out_->push_back(' ');
  AppendValue(out_, value);
  out_->push_back('\n');
}

void ExpositionWriter::Finish() {
  if (format_ == Format::kOpenMetrics) out_->append("# EOF\n");
}

}  // namespace gpulet::metrics
