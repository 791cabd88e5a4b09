// One command-line convention for every gpulet binary (issues 22, 32): a usage error is one line
// in the binary's voice, "<binary> <command>: <what>", with a "did you mean" for a mistyped flag
// or (sub)command at any depth, and exits 2; --help shows each option's default and the
// command's example, and exits 0 as --version does. Header-only: the mains include it (the static
// hook, which has no CLI11, shares only DidYouMean through did_you_mean.h).
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/did_you_mean.h"

namespace gpulet::cmd {

inline constexpr int kUsageError = 2;

// Help in one layout: "--flag TYPE" (allowed values after the type where a check lists them),
// the description, then "(default: X)" where the option has one; the footer holds the example.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(34); }
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty())
      out += " " + opt->get_type_name();
    if (opt->get_type_size() != 0 && opt->get_required()) out += " REQUIRED";
    if (!opt->get_envname().empty()) out += " (env " + opt->get_envname() + ")";
    return out;
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string d = opt->get_description();
    const std::string& def = opt->get_default_str();
    // Flags (no value) and empty lists have no default worth a word; a description that says
    // its default in words ("default: number of CPUs") is not given a second one.
    if (opt->get_type_size() != 0 && !def.empty() && def != "[]" && !opt->get_required() &&
        d.find("default") == std::string::npos)
      d += " (default: " + def + ")";
    return d;
  }
};

// The conventions on a top-level app, before any subcommand or option is added (subcommands
// inherit them): the formatter, and defaults captured for every option that has a variable.
inline void UseConventions(CLI::App& app) {
  app.formatter(std::make_shared<HelpFormatter>());
  app.option_defaults()->always_capture_default();
}

// The example a command's --help ends with, as a user would type it.
inline void Example(CLI::App& sub, const std::string& command_line) {
  sub.footer("Example:\n  " + command_line);
}

// "gpulet sim fault": the app's name and the subcommands parsed so far (the deepest is the one the
// user was talking to when the parse failed).
inline std::string CommandPath(const CLI::App& app) {
  std::string who = app.get_name();
  for (const CLI::App* cur = &app; !cur->get_subcommands().empty();) {
    cur = cur->get_subcommands().front();
    who += " " + cur->get_name();
  }
  return who;
}

namespace internal {

inline const CLI::App* Deepest(const CLI::App& app) {
  const CLI::App* cur = &app;
  while (!cur->get_subcommands().empty()) cur = cur->get_subcommands().front();
  return cur;
}

// The words a user could have meant at the point the parse stopped: the long flags of the
// deepest command and its parents, and the deepest command's own subcommands.
inline void Candidates(const CLI::App& deepest, std::vector<std::string>* flags,
                       std::vector<std::string>* commands) {
  for (const CLI::App* a = &deepest; a; a = a->get_parent())
    for (const CLI::Option* o : a->get_options())
      for (const auto& l : o->get_lnames()) flags->push_back("--" + l);
  for (const CLI::App* sub : deepest.get_subcommands({})) commands->push_back(sub->get_name());
}

}  // namespace internal

// The hint for a failed parse: the first unknown flag or subcommand of argv that is close to a
// known one, as " Did you mean X?", or "".
inline std::string Hint(const CLI::App& app, const CLI::Error& e, int argc, char** argv) {
  std::vector<std::string> flags, commands;
  internal::Candidates(*internal::Deepest(app), &flags, &commands);
  const std::string what = e.what();
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    word = word.substr(0, word.find('='));
    bool flag = word.rfind("--", 0) == 0;
    // A bare word is a candidate command only where the parser named it as unexpected or still
    // wants a command (values of flags are bare words too).
    bool command = !flag && !word.empty() && word[0] != '-' && !commands.empty() &&
                   (what.find(word) != std::string::npos ||
                    what.find("subcommand is required") != std::string::npos);
    const std::vector<std::string>& known = flag ? flags : commands;
    if ((!flag && !command) || std::find(known.begin(), known.end(), word) != known.end()) continue;
    std::string hint = DidYouMean(known, word);
    if (!hint.empty()) return " Did you mean " + hint + "?";
  }
  return "";
}

// Parses; returns the exit status when the program should stop here (help, version, usage error).
inline std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    const std::string who = CommandPath(app);
    std::string what = e.what();
    while (!what.empty() && (what.back() == '.' || what.back() == '\n')) what.pop_back();
    // CLI11 lists the words it did not expect last one first; the user typed them the other way.
    const std::string extras = "The following arguments were not expected: ";
    if (what.rfind(extras, 0) == 0) {
      std::istringstream in(what.substr(extras.size()));
      std::vector<std::string> words;
      for (std::string w; in >> w;) words.insert(words.begin(), w);
      what = "not expected:";
      for (const std::string& w : words) what += " " + w;
    }
    std::fprintf(stderr, "%s: %s.%s Run `%s --help` for the flags.\n", who.c_str(), what.c_str(),
                 Hint(app, e, argc, argv).c_str(), who.c_str());
    return kUsageError;
  }
  return std::nullopt;
}

}  // namespace gpulet::cmd
