{{/* The name of every object. */}}
{{- define "pm.name" -}}
{{- required "name: give the objects' name" .Values.name -}}
{{- end -}}

{{/* The namespace the server runs in. */}}
{{- define "pm.namespace" -}}
{{- required "namespace.name: give the namespace the server runs in" .Values.namespace.name -}}
{{- end -}}

{{/* The Service's DNS name the serving certificate is for. */}}
{{- define "pm.serviceHost" -}}
{{- printf "%s.%s.svc" (include "pm.name" .) (include "pm.namespace" .) -}}
{{- end -}}

{{/* Where the optional pieces are mounted in the pod. */}}
{{- define "pm.etcdDir" -}}/etc/platform-mesh/etcd{{- end -}}
{{- define "pm.auditPolicyDir" -}}/etc/platform-mesh/audit{{- end -}}

{{/* The audit policy ConfigMap's name. */}}
{{- define "pm.auditPolicyName" -}}
{{- printf "%s-audit-policy" (include "pm.name" .) -}}
{{- end -}}

{{/* The data volume's claim. */}}
{{- define "pm.dataClaim" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-data" (include "pm.name" .)) -}}
{{- end -}}

{{/* The group-versions the server serves, one APIService each. */}}
{{- define "pm.groups" -}}
{{- list "core.platform-mesh.io" "providers.platform-mesh.io" "broker.platform-mesh.io" | toJson -}}
{{- end -}}

{{/*
The generated CA and serving certificate (tls.generate), made once per render and kept in
.Values.tls.generated, so that the Secret and every caBundle agree. An existing Secret of that name
with a ca.crt is reused, so upgrades keep the CA the cluster already trusts.
*/}}
{{- define "pm.generatedTLS" -}}
{{- if not (hasKey .Values.tls "generated") -}}
{{- $name := include "pm.name" . -}}
{{- $ns := include "pm.namespace" . -}}
{{- $existing := lookup "v1" "Secret" $ns .Values.tls.secretName -}}
{{- if and $existing $existing.data (hasKey $existing.data "ca.crt") -}}
{{- $_ := set .Values.tls "generated" (dict "ca" (index $existing.data "ca.crt") "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key")) -}}
{{- else -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $host := include "pm.serviceHost" . -}}
{{- $ca := genCA (printf "%s-ca" $name) $days -}}
{{- $hosts := list $host (printf "%s.cluster.local" $host) (printf "%s.%s" $name $ns) $name -}}
{{- $cert := genSignedCert $host nil $hosts $days $ca -}}
{{- $_ := set .Values.tls "generated" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The base64 PEM CA bundle of the APIServices and webhook configurations. */}}
{{- define "pm.caBundle" -}}
{{- if .Values.tls.generate -}}
{{- include "pm.generatedTLS" . -}}
{{- .Values.tls.generated.ca -}}
{{- else -}}
{{- required "tls.caBundle: give the base64 CA that signed the serving certificate (platform-mesh certs ca-bundle), or set tls.generate" .Values.tls.caBundle -}}
{{- end -}}
{{- end -}}

{{/* The rules both webhook configurations match: every Platform Mesh kind kept as a CRD. */}}
{{- define "pm.webhookRules" -}}
- apiGroups: ["broker.platform-mesh.io"]
  apiVersions: ["v1alpha1"]
  operations: ["CREATE", "UPDATE"]
  resources: ["acceptapis", "migrations", "migrationconfigurations"]
  scope: "*"
- apiGroups: ["core.platform-mesh.io"]
  apiVersions: ["v1alpha1"]
  operations: ["CREATE", "UPDATE"]
  resources: ["platformmeshes", "accounts", "accountinfos"]
  scope: "*"
- apiGroups: ["providers.platform-mesh.io"]
  apiVersions: ["v1alpha1"]
  operations: ["CREATE", "UPDATE"]
  resources: ["providers", "managedproviders"]
  scope: "*"
{{- end -}}

{{/* Checks across values that the schema cannot express. */}}
{{- define "pm.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (empty .Values.etcd.servers) -}}
{{- fail "replicas: more than one replica needs etcd.servers (the embedded store is one file on one pod's volume)" -}}
{{- end -}}
{{- if empty .Values.tls.secretName -}}
{{- fail "tls.secretName: give the serving certificate's Secret (or the Secret tls.generate should make)" -}}
{{- end -}}
{{- if and .Values.etcd.tls.secretName (empty .Values.etcd.servers) -}}
{{- fail "etcd.tls.secretName: set etcd.servers too" -}}
{{- end -}}
{{- end -}}
