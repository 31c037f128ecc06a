#!/usr/bin/env bash
# Builds tokenwatch's Debian package from a built binary, offline, with dpkg-deb alone:
#   scripts/build-deb.sh [BINARY [OUT_DIR]]     (default: target/release/tokenwatch, target/debian)
# DEB_COMPRESS=xz|gzip|none (default xz; the tests pack their debug binary with none: xz takes
# ~45 s over its 120 MB).
# Prints the .deb's path. The package: /usr/bin/tokenwatch, a systemd unit, the default
# configuration /etc/tokenwatch/tokenwatch.yaml (a conffile), the licence, NOTICE, README and
# changelog; its postinst makes the `tokenwatch` system user and /var/lib/tokenwatch (0700) and
# starts the service where systemd runs. Depends are computed from the binary (dpkg-shlibdeps).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
binary=${1:-$root/target/release/tokenwatch}
out=${2:-$root/target/debian}
[ -x "$binary" ] || { echo "error: no executable at $binary (build it first: cargo build --release -p tokenwatch)" >&2; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps dpkg-architecture gzip; do
    command -v "$tool" >/dev/null || { echo "error: $tool is missing (Debian: apt-get install dpkg-dev)" >&2; exit 1; }
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
[ -n "$version" ] || { echo "error: no [workspace.package] version in $root/Cargo.toml" >&2; exit 1; }
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
pkg=$(mktemp -d)
trap 'rm -rf "$pkg"' EXIT
stage=$pkg/tokenwatch

install -D -m 0755 "$binary" "$stage/usr/bin/tokenwatch"
install -D -m 0644 "$root/packaging/debian/tokenwatch.service" "$stage/lib/systemd/system/tokenwatch.service"
install -D -m 0640 "$root/packaging/debian/tokenwatch.yaml" "$stage/etc/tokenwatch/tokenwatch.yaml"
doc=$stage/usr/share/doc/tokenwatch
install -D -m 0644 "$root/README.md" "$doc/README.md"
install -D -m 0644 "$root/NOTICE" "$doc/NOTICE"
gzip -9n -c "$root/CHANGELOG.md" > "$doc/changelog.gz"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: tokenwatch"
    echo
    echo "Files: *"
    echo "Copyright: 2026 the tokenwatch authors"
    echo "License: Apache-2.0"
    echo " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0."
    echo
    echo "Files: usr/bin/tokenwatch"
    echo "Comment: the binary's web UI embeds uPlot 1.6.32 (https://github.com/leeoniya/uPlot)"
    echo "Copyright: 2022 Leon Sorokin"
    echo "License: MIT"
    sed -e 's/^$/./' -e 's/^/ /' "$root/crates/tokenwatch/ui/vendor/uPlot.LICENSE"
} > "$doc/copyright"
chmod 0644 "$doc/copyright"

# Shared-library dependencies of the binary, as dpkg-shlibdeps reads them (it wants a
# debian/control beside it).
mkdir -p "$pkg/src/debian"
printf 'Source: tokenwatch\n\nPackage: tokenwatch\nArchitecture: any\n' > "$pkg/src/debian/control"
depends=$(cd "$pkg/src" && dpkg-shlibdeps -O "$stage/usr/bin/tokenwatch" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "error: dpkg-shlibdeps found no dependencies of $binary" >&2; exit 1; }

mkdir -p "$stage/DEBIAN"
install -m 0755 "$root/packaging/debian/postinst" "$root/packaging/debian/prerm" "$root/packaging/debian/postrm" "$stage/DEBIAN/"
echo /etc/tokenwatch/tokenwatch.yaml > "$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: tokenwatch
Version: $version
Architecture: $arch
Maintainer: tokenwatch authors <tokenwatch@localhost>
Installed-Size: $size
Depends: $depends, passwd
Recommends: ca-certificates
Section: net
Priority: optional
Description: token-level observability and alerting for LLM inference fleets
 tokenwatch measures what callers of an inference server feel (time to first
 token, inter-token latency and their tails) from a proxy in front of vLLM,
 TGI, SGLang, Triton or a hosted API, or from their metrics and OpenTelemetry
 traces alone, watches GPU memory, KV cache and queueing, and raises few,
 graded alerts that say where the cause most likely is.
CONTROL

mkdir -p "$out"
deb=$out/tokenwatch_${version}_${arch}.deb
dpkg-deb --root-owner-group "-Z${DEB_COMPRESS:-xz}" --build "$stage" "$deb" >/dev/null
echo "$deb"
