#!/bin/sh
# Plays the certificate issuer of the provider cluster that kubeconfig $1 reaches: every
# Certificate there (the broker's copies) gets a TLS Secret of the same name beside it
# (self-signed by openssl, CN = its fqdn, O = the issuer's name $2) and the status `Available`
# naming that Secret in status.relatedResources, as cert-manager would.
set -eu
kubeconfig="${1:?usage: issue.sh <kubeconfig> <issuer name>}"
issuer="${2:?usage: issue.sh <kubeconfig> <issuer name>}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
list() {
  kubectl --kubeconfig "$kubeconfig" get certificates -A -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name} {.spec.fqdn}{"\n"}{end}'
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
while read -r ns name fqdn; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=$fqdn/O=$issuer" -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
  kubectl --kubeconfig "$kubeconfig" -n "$ns" create secret tls "$name" --cert="$dir/tls.crt" \
    --key="$dir/tls.key" --dry-run=client -o yaml | kubectl --kubeconfig "$kubeconfig" apply -f -
  kubectl --kubeconfig "$kubeconfig" -n "$ns" patch certificate "$name" --subresource=status --type=merge -p \
    "{\"status\":{\"status\":\"Available\",\"relatedResources\":{\"secret\":{\"name\":\"$name\",\"namespace\":\"$ns\",\"gvk\":{\"group\":\"core\",\"version\":\"v1\",\"kind\":\"Secret\"}}}}}"
done < "$dir/certificates"
