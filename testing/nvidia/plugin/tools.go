//go:build tools

// Keeps the pinned commands in the module graph for go mod tidy; ../build compiles them.
package tools

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
)
