//go:build tools

// Package tools names the command ./build compiles, so that `go mod tidy` keeps its dependencies in
// go.mod/go.sum. It is never compiled (build tag "tools").
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
