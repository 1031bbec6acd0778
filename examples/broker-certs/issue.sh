#!/bin/sh
# Plays a certificate issuer in the current workspace, as cert-manager would on a real provider:
# waits for the broker's copy of a Certificate, then gives every Certificate a TLS Secret of the
# same name (self-signed by openssl, CN = its fqdn, O = the issuer's name) and the status
# `Available` naming that Secret in status.relatedResources.
set -eu
issuer="${1:?usage: issue.sh <issuer name>}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tries=0
until kubectl get certificates -o name | grep -q .; do
  tries=$((tries + 1))
  if [ "$tries" -ge 300 ]; then
    echo "no Certificate reached $issuer within 60 s" >&2
    exit 1
  fi
  sleep 0.2
done
for name in $(kubectl get certificates -o jsonpath='{.items[*].metadata.name}'); do
  fqdn=$(kubectl get certificate "$name" -o jsonpath='{.spec.fqdn}')
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=$fqdn/O=$issuer" -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
  kubectl create secret tls "$name" --cert="$dir/tls.crt" --key="$dir/tls.key" \
    --dry-run=client -o yaml | kubectl apply -f -
  kubectl patch certificate "$name" --subresource=status --type=merge -p \
    "{\"status\":{\"status\":\"Available\",\"relatedResources\":{\"secret\":{\"name\":\"$name\",\"namespace\":\"default\",\"gvk\":{\"group\":\"core\",\"version\":\"v1\",\"kind\":\"Secret\"}}}}}"
done
