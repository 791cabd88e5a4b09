// Two log layouts for one binary: a one-shot command (info, cdi, runtime configure, ...) speaks in
// the command's voice, "gpulet info: warning: ...", like its errors; a long-running one (agent,
// exporter, scheduler, ...) keeps timestamps, which its logs need, and says so by calling
// UseDaemonLogs() when it starts serving.
#pragma once

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace gpulet::cmd {

namespace internal {

// "%*": nothing for info and below, "warning: " / "error: " above.
class LevelWord final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const char* w = msg.level == spdlog::level::warn    ? "warning: "
                    : msg.level >= spdlog::level::err   ? "error: "
                    : msg.level <= spdlog::level::debug ? "debug: "
                                                        : "";
    dest.append(w, w + std::char_traits<char>::length(w));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<LevelWord>();
  }
};

}  // namespace internal

// "<who>: [warning: ]<message>" for every log line of this process.
inline void UseOneShotLogs(const std::string& who) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<internal::LevelWord>('*').set_pattern(who + ": %*%v");
  spdlog::set_formatter(std::move(f));
}

// spdlog's default layout: "[2024-01-01 12:00:00.000] [info] message".
inline void UseDaemonLogs() { spdlog::set_pattern("%+"); }

}  // namespace gpulet::cmd
