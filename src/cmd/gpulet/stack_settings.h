// What `gpulet agent` and `gpulet validate` check of a node that depends on the device plugin's
// config (node::ValidateOptions from plugin::Config).
#pragma once

#include "dra/devices.h"
#include "node/validate.h"
#include "plugin/config.h"

namespace gpulet::cmd {

// How the device plugin hands GPUs to containers (checked against the node's engine), and whether
// a DRA driver serves GPUs (then its slices stand in for device-plugin resources).
inline node::ValidateOptions WithPluginSettings(node::ValidateOptions vo, const plugin::Config& c) {
  if (!c.dra.gpus.empty()) vo.dra_driver = dra::kDriverName;
  vo.delivery = node::GpuDelivery{c.list.cdi_cri,
                                  c.list.envvar || c.list.volume_mounts || c.list.cdi_annotations,
                                  c.pass_device_specs};
  return vo;
}

}  // namespace gpulet::cmd
