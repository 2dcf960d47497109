#!/bin/sh
# The base image the Containerfile builds on (its BASE), made here from Debian's packages:
# no container registry is needed (none is reachable on the machines rsd is built and
# tested on). A minimal Debian (debootstrap's minbase: dpkg, apt and the essential
# packages, no Python yet) with the updates of its release, trimmed as Debian's own
# "slim" images are: no documentation but the copyright files, no manual pages, no
# translations, no package lists or caches; and apt set up so that the Containerfile's
# installs stay so (no translations, no caches, no recommended packages).
#
#   sh deploy/image/base.sh IMAGE [SUITE] [MIRROR]
#
# builds IMAGE (e.g. localhost/rsd-base:bookworm) with buildah, as root. Any Debian image
# of the same release serves as well (the Containerfile's BASE argument).
set -eu
image=$1
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}

container=$(buildah from scratch)
root=$(buildah mount "$container")
trap 'umount "$root/proc" 2>/dev/null; buildah rm "$container" >/dev/null' EXIT

debootstrap --variant=minbase "$suite" "$root" "$mirror"

cat > "$root/etc/dpkg/dpkg.cfg.d/slim" <<CONF
# As Debian's slim images: no documentation but the licences, no manuals, no translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
# A build's unpacking is thrown away if it fails: no fsync per file.
force-unsafe-io
CONF
cat > "$root/etc/apt/apt.conf.d/slim" <<CONF
Acquire::Languages "none";
Acquire::GzipIndexes "true";
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb"; };
CONF
rm -f "$root/etc/apt/sources.list"
cat > "$root/etc/apt/sources.list.d/debian.sources" <<CONF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
CONF

# The release's updates (security ones first of all), then what a slim image leaves out.
mount -t proc proc "$root/proc"
chroot "$root" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q'
umount "$root/proc"
rm -rf "$root"/etc/resolv.conf "$root"/etc/hostname "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/var/log/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/usr/share/lintian/*
find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete

buildah umount "$container" >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd /bin/bash "$container"
buildah commit --quiet --rm "$container" "$image"
trap - EXIT
