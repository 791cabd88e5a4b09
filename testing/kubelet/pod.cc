// Pod YAML reading and the API server's validation rules for extended resources.
#include "testing/kubelet/pod.h"

#include <cctype>
#include <cstdio>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/status.h"
#include "yaml-cpp/yaml.h"

namespace gpulet::emu {
namespace {

// A DNS-1123 subdomain (the prefix of a qualified name).
bool IsDnsSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alnum =
        std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c));
    if (!alnum && c != '-' && c != '.') return false;
    if ((i == 0 || i + 1 == s.size()) && !alnum) return false;
  }
  return true;
}

// The name part of a qualified name: 1..63 alphanumerics with '-', '_', '.' inside.
bool IsQualifiedNamePart(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alnum = std::isalnum(static_cast<unsigned char>(c));
    if (!alnum && c != '-' && c != '_' && c != '.') return false;
    if ((i == 0 || i + 1 == s.size()) && !alnum) return false;
  }
  return true;
}

class Reader {
 public:
  Reader(std::string file) : file_(std::move(file)) {}

  absl::Status Error(const YAML::Node& at, const std::string& what) const {
    int line = at.IsDefined() ? at.Mark().line + 1 : 0;
    return absl::InvalidArgumentError(line > 0 ? absl::StrCat(file_, ":", line, ": ", what)
                                               : absl::StrCat(file_, ": ", what));
  }

  // A scalar field as a string; "" when absent. Error when present but not a scalar.
  absl::StatusOr<std::string> Scalar(const YAML::Node& parent, const char* key,
                                     const std::string& path) const {
    YAML::Node n = parent[key];
    if (!n || n.IsNull()) return std::string();
    if (!n.IsScalar()) return Error(n, absl::StrCat(path, ": must be a string"));
    return n.Scalar();
  }

  absl::StatusOr<std::map<std::string, std::string>> StringMap(const YAML::Node& n,
                                                               const std::string& path) const {
    std::map<std::string, std::string> out;
    if (!n || n.IsNull()) return out;
    if (!n.IsMap()) return Error(n, absl::StrCat(path, ": must be a map"));
    for (const auto& kv : n) {
      if (!kv.second.IsScalar())
        return Error(kv.second, absl::StrCat(path, "[", kv.first.Scalar(), "]: must be a string"));
      out[kv.first.Scalar()] = kv.second.Scalar();
    }
    return out;
  }

  absl::StatusOr<PodSpec> Pod(const YAML::Node& doc) const {
    PodSpec pod;
    pod.source = absl::StrCat(file_, ":", doc.Mark().line + 1);
    if (!doc.IsMap()) return Error(doc, "a Pod document must be a map");
    ASSIGN_OR_RETURN(std::string kind, Scalar(doc, "kind", "kind"));
    if (kind != "Pod")
      return Error(
          doc["kind"] ? doc["kind"] : doc,
          absl::StrCat("kind: \"", kind, "\" is not supported; only kind: Pod (apiVersion v1)"));
    ASSIGN_OR_RETURN(std::string api, Scalar(doc, "apiVersion", "apiVersion"));
    if (api != "v1")
      return Error(doc["apiVersion"] ? doc["apiVersion"] : doc,
                   absl::StrCat("apiVersion: \"", api, "\" is not v1"));
    YAML::Node meta = doc["metadata"];
    if (!meta || !meta.IsMap()) return Error(doc, "metadata: Required value");
    ASSIGN_OR_RETURN(pod.name, Scalar(meta, "name", "metadata.name"));
    if (pod.name.empty())
      return Error(meta, "metadata.name: Required value: name or generateName is required");
    if (!IsDnsSubdomain(pod.name))
      return Error(meta["name"], absl::StrCat("metadata.name: Invalid value: \"", pod.name,
                                              "\": must be a lowercase RFC 1123 subdomain"));
    ASSIGN_OR_RETURN(std::string ns, Scalar(meta, "namespace", "metadata.namespace"));
    if (!ns.empty()) pod.namespace_ = ns;
    ASSIGN_OR_RETURN(pod.uid, Scalar(meta, "uid", "metadata.uid"));
    if (pod.uid.empty()) {
      // Deterministic, UUID-shaped, so a re-run of the same pods finds its checkpoint entries.
      size_t h1 = std::hash<std::string>{}(pod.Key());
      size_t h2 = std::hash<std::string>{}(pod.Key() + "#");
      char buf[40];
      std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", unsigned(h1 >> 32),
                    unsigned(h1 >> 16 & 0xffff), unsigned(h1 & 0xffff), unsigned(h2 >> 48),
                    static_cast<unsigned long long>(h2 & 0xffffffffffffULL));
      pod.uid = buf;
    }
    ASSIGN_OR_RETURN(pod.annotations, StringMap(meta["annotations"], "metadata.annotations"));
    if (YAML::Node owners = meta["ownerReferences"]; owners && !owners.IsNull()) {
      if (!owners.IsSequence()) return Error(owners, "metadata.ownerReferences: must be a list");
      for (const auto& o : owners) {
        OwnerReference r;
        ASSIGN_OR_RETURN(r.api_version, Scalar(o, "apiVersion", "ownerReferences.apiVersion"));
        ASSIGN_OR_RETURN(r.kind, Scalar(o, "kind", "ownerReferences.kind"));
        ASSIGN_OR_RETURN(r.name, Scalar(o, "name", "ownerReferences.name"));
        ASSIGN_OR_RETURN(r.uid, Scalar(o, "uid", "ownerReferences.uid"));
        r.controller =
            o["controller"] && o["controller"].IsScalar() && o["controller"].Scalar() == "true";
        pod.owner_references.push_back(std::move(r));
      }
    }
    if (auto it = pod.annotations.find(kRunTimeAnnotation); it != pod.annotations.end()) {
      // A bare number has meant seconds here since the first version (documented, kept).
      auto d = ParseDuration(absl::StrCat("metadata.annotations[", kRunTimeAnnotation, "]"),
                             it->second, {.allow_zero = true, .bare_unit = absl::Seconds(1)});
      if (!d.ok())
        return Error(meta["annotations"][kRunTimeAnnotation], std::string(d.status().message()));
      pod.run_time_ms = absl::ToInt64Milliseconds(d->value);
      // The docs promise the warning for the bare number (seconds) kept from the first version.
      if (!d->deprecation.empty())
        pod.warnings.push_back(absl::StrCat(file_, ":",
                                            meta["annotations"][kRunTimeAnnotation].Mark().line + 1,
                                            ": ", d->deprecation));
    }
    YAML::Node spec = doc["spec"];
    if (!spec || !spec.IsMap()) return Error(doc, "spec: Required value");
    ASSIGN_OR_RETURN(pod.node_name, Scalar(spec, "nodeName", "spec.nodeName"));
    YAML::Node containers = spec["containers"];
    if (!containers || !containers.IsSequence() || containers.size() == 0)
      return Error(containers ? containers : spec, "spec.containers: Required value");
    for (size_t i = 0; i < containers.size(); ++i) {
      ASSIGN_OR_RETURN(ContainerSpec c,
                       Container(containers[i], absl::StrCat("spec.containers[", i, "]")));
      for (const auto& prev : pod.containers)
        if (prev.name == c.name)
          return Error(
              containers[i]["name"],
              absl::StrCat("spec.containers[", i, "].name: Duplicate value: \"", c.name, "\""));
      pod.containers.push_back(std::move(c));
    }
    return pod;
  }

  absl::StatusOr<ContainerSpec> Container(const YAML::Node& n, const std::string& path) const {
    ContainerSpec c;
    if (!n.IsMap()) return Error(n, absl::StrCat(path, ": must be a map"));
    ASSIGN_OR_RETURN(c.name, Scalar(n, "name", path + ".name"));
    if (c.name.empty()) return Error(n, path + ".name: Required value");
    ASSIGN_OR_RETURN(c.image, Scalar(n, "image", path + ".image"));
    if (c.image.empty()) return Error(n, path + ".image: Required value");
    if (YAML::Node env = n["env"]; env && !env.IsNull()) {
      if (!env.IsSequence()) return Error(env, path + ".env: must be a list");
      for (size_t i = 0; i < env.size(); ++i) {
        std::string p = absl::StrCat(path, ".env[", i, "]");
        ASSIGN_OR_RETURN(std::string name, Scalar(env[i], "name", p + ".name"));
        if (name.empty()) return Error(env[i], p + ".name: Required value");
        ASSIGN_OR_RETURN(std::string value, Scalar(env[i], "value", p + ".value"));
        c.env.emplace_back(std::move(name), std::move(value));
      }
    }
    YAML::Node res = n["resources"];
    if (res && !res.IsNull()) {
      if (!res.IsMap()) return Error(res, path + ".resources: must be a map");
      ASSIGN_OR_RETURN(c.limits, StringMap(res["limits"], path + ".resources.limits"));
      ASSIGN_OR_RETURN(c.requests, StringMap(res["requests"], path + ".resources.requests"));
    }
    // The API server's rules for extended resources (ValidateResourceRequirements).
    for (const auto* which : {&c.limits, &c.requests}) {
      const char* field = which == &c.limits ? "limits" : "requests";
      for (const auto& [name, qty] : *which) {
        if (!IsExtendedResourceName(name)) continue;
        int64_t v;
        YAML::Node at = res[field][name];
        std::string p = absl::StrCat(path, ".resources.", field, "[", name, "]");
        if (!absl::SimpleAtoi(qty, &v))
          return Error(at, absl::StrCat(p, ": Invalid value: \"", qty, "\": must be an integer"));
        if (v < 0)
          return Error(at, absl::StrCat(p, ": Invalid value: \"", qty,
                                        "\": must be greater than or equal to 0"));
      }
    }
    for (const auto& [name, qty] : c.requests) {
      if (!IsExtendedResourceName(name)) continue;
      auto lim = c.limits.find(name);
      if (lim == c.limits.end())
        return Error(res["requests"][name],
                     absl::StrCat(path,
                                  ".resources.limits: Required value: Limit must be set for "
                                  "non overcommitable resources (",
                                  name, ")"));
      int64_t a = 0, b = 0;
      (void)absl::SimpleAtoi(qty, &a);
      (void)absl::SimpleAtoi(lim->second, &b);
      if (a != b)
        return Error(res["requests"][name],
                     absl::StrCat(path, ".resources.requests[", name, "]: Invalid value: \"", qty,
                                  "\": must be equal to ", name, " limit of ", lim->second));
    }
    return c;
  }

 private:
  std::string file_;
};

}  // namespace

bool IsExtendedResourceName(const std::string& name) {
  size_t slash = name.find('/');
  if (slash == std::string::npos) return false;  // native: cpu, memory, hugepages-*, ...
  if (absl::StrContains(name, "kubernetes.io/")) return false;
  if (absl::StartsWith(name, "requests.")) return false;
  if (name.find('/', slash + 1) != std::string::npos) return false;
  return IsDnsSubdomain(std::string_view(name).substr(0, slash)) &&
         IsQualifiedNamePart(std::string_view(name).substr(slash + 1));
}

absl::StatusOr<std::vector<PodSpec>> ParsePods(const std::string& yaml_text,
                                               const std::string& filename) {
  // Documents are split here and loaded one by one instead of YAML::LoadAll: yaml-cpp 0.7's LoadAll
  // never returns on some malformed input (", x" allocates until the process dies; found by
  // tests/fuzz/pods). A document starts at a line beginning with "---"; each is padded with the
  // newlines before it so yaml-cpp's marks stay file line numbers.
  std::vector<YAML::Node> docs;
  size_t start = 0, line = 0, doc_line = 0;
  auto load = [&](size_t end) -> absl::Status {
    try {
      docs.push_back(
          YAML::Load(std::string(doc_line, '\n') + yaml_text.substr(start, end - start)));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(filename, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg));
    }
    return absl::OkStatus();
  };
  for (size_t at = 0; at <= yaml_text.size(); ++line) {
    size_t eol = yaml_text.find('\n', at);
    if (eol == std::string::npos) eol = yaml_text.size();
    std::string_view l(yaml_text.data() + at, eol - at);
    if (at > start && l.substr(0, 3) == "---" && (l.size() == 3 || l[3] == ' ' || l[3] == '\r')) {
      RETURN_IF_ERROR(load(at));
      start = at, doc_line = line;
    }
    at = eol + 1;
  }
  RETURN_IF_ERROR(load(yaml_text.size()));
  Reader reader(filename);
  std::vector<PodSpec> pods;
  // The reader checks the shapes it expects; a shape it does not (a scalar where a map belongs,
  // found by tests/fuzz/pods) still throws from yaml-cpp: one error naming the place, not a crash.
  try {
    for (const auto& doc : docs) {
      if (!doc || doc.IsNull()) continue;  // empty document between separators
      ASSIGN_OR_RETURN(PodSpec pod, reader.Pod(doc));
      pods.push_back(std::move(pod));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(filename, ":", e.mark.line + 1, ": not a Pod as expected: ", e.msg));
  }
  if (pods.empty()) return absl::InvalidArgumentError(absl::StrCat(filename, ": no Pod in file"));
  return pods;
}

absl::StatusOr<std::vector<PodSpec>> LoadPodFile(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read pod file: ", text.status().message()));
  return ParsePods(*text, path);
}

int64_t ExtendedRequest(const ContainerSpec& c, const std::string& resource) {
  auto it = c.limits.find(resource);
  int64_t v = 0;
  if (it != c.limits.end() && absl::SimpleAtoi(it->second, &v)) return v;
  return 0;
}

}  // namespace gpulet::emu
