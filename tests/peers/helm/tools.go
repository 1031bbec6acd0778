//go:build tools

// Package tools pins the Helm the tests render deploy/chart with: `scripts/peers` builds its
// cmd/helm.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
