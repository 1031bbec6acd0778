//go:build tools

// Package tools pins the kcp server the tests meet: `scripts/peers` builds its cmd/kcp.
package tools

import _ "github.com/kcp-dev/kcp/cmd/kcp"
