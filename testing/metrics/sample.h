// The metrics unit tests' Sample of a GpuLayer (testing/gpu/fake_gpu.h in the tests), for the
// renderers without a Sampler in between.
#pragma once

#include "gpu/gpu.h"
#include "metrics/render.h"

namespace gpulet::testing_metrics {

// A metrics Sample of every GPU of `g`, all healthy, on host "node1".
inline metrics::Sample SampleOf(gpu::GpuLayer& g) {
  metrics::Sample s;
  s.hostname = "node1";
  auto inv = g.GetInventory();
  s.driver_version = inv->driver_version;
  s.cuda_driver_version = inv->cuda_driver_version;
  for (const gpu::Device& d : inv->devices) {
    metrics::DeviceSample ds;
    ds.device = d;
    ds.telemetry = *g.GetTelemetry(d.index);
    ds.healthy = true;
    s.devices.push_back(ds);
  }
  s.self.nvml_up = true;
  return s;
}

}  // namespace gpulet::testing_metrics
