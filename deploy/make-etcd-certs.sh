#!/usr/bin/env bash
# Certificates for an etcd that serves only TLS and accepts only clients with a certificate from its CA
# (etcd --client-cert-auth). This is the setup in "Securing etcd" in deploy/README.md.
#
#   deploy/make-etcd-certs.sh DIR [NAME|IP ...]
#
# It writes into DIR (created if needed; the files are mode 0600):
#   ca.crt, ca.key          a new CA. Keep ca.key off the cluster and out of git, or delete it: nothing
#                           needs it after this, and whoever holds it can mint client certificates.
#   server.crt, server.key  etcd's certificate (serverAuth and clientAuth). Its names are etcd, localhost,
#                           127.0.0.1 and ::1, plus each NAME or IP given: the host part of every
#                           --etcd HOST:PORT that clients use.
#   client.crt, client.key  the certificate (CN litz) that Litz passes with --etcd-cert/--etcd-key
#
# Examples:
#   deploy/make-etcd-certs.sh deploy/kubernetes/certs              # the Service `etcd` (kustomize reads these)
#   deploy/make-etcd-certs.sh deploy/kubernetes/certs etcd.ml.svc  # also the name in namespace ml
#   deploy/make-etcd-certs.sh ~/litz-etcd etcd1.example.org 10.0.0.5
#
# The certificates are valid for DAYS days (default 365). EC P-256 keys. Needs openssl (1.1.1 or later).
# The script does not overwrite existing certificates: to make new ones, remove the old files first.
set -euo pipefail

case "${1:-}" in
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    ""|-*) echo "usage: $0 DIR [NAME|IP ...]" >&2; exit 2 ;;
esac
DIR=$1
shift
DAYS=${DAYS:-365}
command -v openssl >/dev/null || { echo "make-etcd-certs: openssl not found" >&2; exit 2; }
[[ $DAYS =~ ^[1-9][0-9]*$ ]] || { echo "make-etcd-certs: DAYS must be a positive number" >&2; exit 2; }

# etcd: the Service and compose service name; localhost, 127.0.0.1, ::1: etcdctl health checks in the pod
SAN="DNS:etcd,DNS:localhost,IP:127.0.0.1,IP:::1"
NAMES="etcd localhost 127.0.0.1 ::1"
for name in "$@"; do
    if [[ $name =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || ( $name == *:* && $name =~ ^[0-9A-Fa-f:.]+$ ) ]]; then
        SAN+=",IP:$name"
    elif [[ $name =~ ^[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]]; then
        SAN+=",DNS:$name"
    else
        echo "make-etcd-certs: $name is neither a host name nor an IP address" >&2
        exit 2
    fi
    NAMES+=" $name"
done

umask 077
mkdir -p "$DIR"
for f in ca.crt ca.key server.crt server.key client.crt client.key; do
    if [ -e "$DIR/$f" ]; then
        echo "make-etcd-certs: $DIR/$f exists; remove the old certificates first" >&2
        exit 1
    fi
done
WORK=$(mktemp -d "$DIR/.make-etcd-certs.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ssl() { openssl "$@" 2>"$WORK/openssl.err" || { cat "$WORK/openssl.err" >&2; exit 1; }; }
serial() { echo "0x$(openssl rand -hex 16)"; }

# sign WHO CN ISSUER_CRT ISSUER_KEY EXTENSIONS...: WHO.key, and WHO.crt signed by the issuer (itself if
# ISSUER_CRT is "self")
sign() {
    local who=$1 cn=$2 issuer=$3 issuer_key=$4
    shift 4
    ssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/$who.key"
    ssl req -new -key "$WORK/$who.key" -subj "/CN=$cn" -out "$WORK/$who.csr"
    printf '%s\n' "$@" >"$WORK/$who.ext"
    if [ "$issuer" = self ]; then
        ssl x509 -req -in "$WORK/$who.csr" -signkey "$WORK/$who.key" -days "$DAYS" -sha256 \
            -set_serial "$(serial)" -extfile "$WORK/$who.ext" -out "$WORK/$who.crt"
    else
        ssl x509 -req -in "$WORK/$who.csr" -CA "$issuer" -CAkey "$issuer_key" -days "$DAYS" -sha256 \
            -set_serial "$(serial)" -extfile "$WORK/$who.ext" -out "$WORK/$who.crt"
    fi
}

sign ca "Litz etcd CA" self "" \
    "basicConstraints = critical, CA:TRUE, pathlen:0" \
    "keyUsage = critical, keyCertSign, cRLSign" \
    "subjectKeyIdentifier = hash"
LEAF=("basicConstraints = critical, CA:FALSE" "keyUsage = critical, digitalSignature"
      "subjectKeyIdentifier = hash" "authorityKeyIdentifier = keyid")
# clientAuth too: etcd's own gateway and etcdctl in the etcd container present this certificate as a client
sign server etcd "$WORK/ca.crt" "$WORK/ca.key" "${LEAF[@]}" \
    "extendedKeyUsage = serverAuth, clientAuth" "subjectAltName = $SAN"
sign client litz "$WORK/ca.crt" "$WORK/ca.key" "${LEAF[@]}" "extendedKeyUsage = clientAuth"
ssl verify -CAfile "$WORK/ca.crt" "$WORK/server.crt" "$WORK/client.crt" >/dev/null

for f in ca.crt ca.key server.crt server.key client.crt client.key; do
    mv "$WORK/$f" "$DIR/$f"
done
echo "make-etcd-certs: wrote $DIR/{ca,server,client}.{crt,key}, valid for $DAYS days"
echo "  server.crt names: $NAMES"
echo "  etcd:  --cert-file $DIR/server.crt --key-file $DIR/server.key --client-cert-auth --trusted-ca-file $DIR/ca.crt"
echo "  litz:  --etcd-cacert $DIR/ca.crt --etcd-cert $DIR/client.crt --etcd-key $DIR/client.key"
echo "  keep $DIR/ca.key private, or delete it"
