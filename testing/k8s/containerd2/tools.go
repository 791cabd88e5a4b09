//go:build tools

// Package tools names the commands ../build compiles, so that `go mod tidy` keeps their
// dependencies in go.mod/go.sum. It is never compiled (build tag "tools").
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
