// AdmissionReview bodies the API server posts to the webhook, parsed as the server parses them
// (depth-limited) and judged by Validate and Mutate; the pod inside is the pod author's.
#include "http/guarded_server.h"
#include "scheduler/webhook.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpulet::fuzz::QuietLogs();
  static gpulet::scheduler::AdmissionWebhook* webhook = [] {
    gpulet::scheduler::WebhookOptions o;
    o.max_memory_units = 320;
    o.scheduler_name = "gpulet-scheduler";
    return new gpulet::scheduler::AdmissionWebhook(o, nullptr);
  }();
  auto body = gpulet::http::ParseUntrustedJson(gpulet::fuzz::Input(data, size));
  if (!body.ok()) return 0;
  (void)webhook->Validate(body->value);
  (void)webhook->Mutate(body->value);
  return 0;
}
