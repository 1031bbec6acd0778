#!/bin/sh
# Plays the certificate issuer of the provider workspace kubectl is in, as cert-manager behind
# kcp's api-syncagent would: through the virtual workspace of the provider's `certificates`
# APIExport it sees every Certificate placed with the provider (in the broker's staging
# workspaces bound to the export), gives each a TLS Secret of the same name (self-signed by
# openssl, CN = its fqdn, O = the issuer's name) beside it, and the status `Available` naming
# that Secret in status.relatedResources.
set -eu
issuer="${1:?usage: issue.sh <issuer name>}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
vw=$(kubectl get apiexportendpointslice certificates -o jsonpath='{.status.endpoints[0].url}')
list() {
  kubectl --server "$vw/clusters/*" get certificates -A -o jsonpath='{range .items[*]}{.metadata.annotations.kcp\.io/cluster} {.metadata.namespace} {.metadata.name} {.spec.fqdn}{"\n"}{end}'
}
tries=0
until list | grep -q .; do
  tries=$((tries + 1))
  if [ "$tries" -ge 300 ]; then
    echo "no Certificate reached $issuer within 60 s" >&2
    exit 1
  fi
  sleep 0.2
done
list > "$dir/certificates"
while read -r cluster ns name fqdn; do
  at="$vw/clusters/$cluster"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=$fqdn/O=$issuer" -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
  kubectl --server "$at" -n "$ns" create secret tls "$name" --cert="$dir/tls.crt" \
    --key="$dir/tls.key" --dry-run=client -o yaml | kubectl --server "$at" apply -f -
  kubectl --server "$at" -n "$ns" patch certificate "$name" --subresource=status --type=merge -p \
    "{\"status\":{\"status\":\"Available\",\"relatedResources\":{\"secret\":{\"name\":\"$name\",\"namespace\":\"$ns\",\"gvk\":{\"group\":\"core\",\"version\":\"v1\",\"kind\":\"Secret\"}}}}}"
done < "$dir/certificates"
