//go:build tools

// Package tools names the CNI plugins ../build compiles, so that `go mod tidy` keeps their
// dependencies in go.mod/go.sum. It is never compiled (build tag "tools").
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
